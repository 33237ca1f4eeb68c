//! `npc validate` through the real binary: the invalid-manifest corpus in
//! `fixtures/invalid/` (one mistake per file, each with an insta snapshot of
//! the human and JSON reports), the valid fixtures, the report-everything
//! fixture, hostile files, and the usage/I/O exit code.
//!
//! Every run clears the environment and starts in the repository root, so
//! file names in the reports are relative (`fixtures/invalid/03-x.toml`) and
//! snapshots are stable on every machine.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{npc, repo_root};

/// Where the one-mistake corpus lives, relative to the repository root.
const INVALID_DIR: &str = "fixtures/invalid";
/// File-name prefix insta gives the corpus snapshots (test binary
/// `integration`, module `validate`, snapshot `invalid__NN-name_toml`).
const SNAPSHOT_PREFIX: &str = "integration__validate__invalid__";
/// Fewest fixtures the corpus must hold (the issue asks for at least 30).
const MIN_INVALID_FIXTURES: usize = 30;

/// Output of one `npc validate` run.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Run `npc validate ARGS…` from the repository root with an empty environment.
fn validate(args: &[&str]) -> Run {
    let out = npc()
        .current_dir(repo_root())
        .env_clear()
        .arg("validate")
        .args(args)
        .output()
        .expect("npc runs");
    Run {
        code: out
            .status
            .code()
            .expect("npc exited, not killed by a signal"),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

/// The corpus: `NN-name.toml` / `NN-name.json` directly in [`INVALID_DIR`]
/// (helper files live in its `files/` subdirectory).
fn invalid_fixtures() -> Vec<PathBuf> {
    let dir = repo_root().join(INVALID_DIR);
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures/invalid exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    for path in &found {
        let name = path.file_name().unwrap().to_string_lossy();
        let numbered =
            name.len() > 3 && name[..2].bytes().all(|b| b.is_ascii_digit()) && &name[2..3] == "-";
        let syntax = name.ends_with(".toml") || name.ends_with(".json");
        assert!(
            numbered && syntax,
            "`{INVALID_DIR}/{name}` does not follow the `NN-short-name.toml|json` scheme"
        );
    }
    found
}

/// Check the shape of a `--format json` report for an invalid manifest and
/// return its diagnostics.
fn check_json_report(fixture: &str, report: &Value) -> Vec<Value> {
    let obj = report.as_object().expect("report is an object");
    let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "format_version",
            "valid",
            "error_count",
            "warning_count",
            "diagnostics"
        ],
        "{fixture}"
    );
    assert_eq!(report["format_version"], "1", "{fixture}");
    assert_eq!(report["valid"], false, "{fixture}");
    let diagnostics = report["diagnostics"].as_array().expect("diagnostics array");
    let errors = diagnostics
        .iter()
        .filter(|d| d["severity"] == "error")
        .count();
    let warnings = diagnostics
        .iter()
        .filter(|d| d["severity"] == "warning")
        .count();
    assert!(errors >= 1, "{fixture}: no error diagnostic");
    assert_eq!(report["error_count"], errors, "{fixture}");
    assert_eq!(report["warning_count"], warnings, "{fixture}");
    assert_eq!(
        errors + warnings,
        diagnostics.len(),
        "{fixture}: bad severity"
    );
    for d in diagnostics {
        assert!(
            d["summary"].as_str().is_some_and(|s| !s.is_empty()),
            "{fixture}: {d}"
        );
        assert!(d["detail"].is_string(), "{fixture}: {d}");
        let range = &d["range"];
        assert!(
            range["filename"].as_str().is_some_and(|f| !f.is_empty()),
            "{fixture}: {d}"
        );
        let pos = |p: &Value| {
            let line = p["line"].as_u64().expect("line");
            let column = p["column"].as_u64().expect("column");
            assert!(line >= 1 && column >= 1, "{fixture}: {d}");
            (line, column)
        };
        assert!(pos(&range["start"]) <= pos(&range["end"]), "{fixture}: {d}");
    }
    diagnostics.clone()
}

/// Each fixture: exit 1, at least one error, a well-formed JSON report that
/// agrees with the human one, and both matching the committed snapshot. A
/// fixture without a snapshot fails here.
#[test]
fn invalid_corpus_matches_snapshots() {
    let fixtures = invalid_fixtures();
    assert!(
        fixtures.len() >= MIN_INVALID_FIXTURES,
        "only {} fixtures in {INVALID_DIR}",
        fixtures.len()
    );
    let snapshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/snapshots");
    let updating = std::env::var("INSTA_UPDATE").is_ok_and(|v| v == "always" || v == "new");
    let mut failures = Vec::new();
    for path in &fixtures {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let rel = format!("{INVALID_DIR}/{file}");
        let human = validate(&[&rel]);
        let json = validate(&[&rel, "--format", "json"]);
        assert_eq!(
            human.code, 1,
            "{rel}: exit code\n{}{}",
            human.stdout, human.stderr
        );
        assert_eq!(json.code, 1, "{rel}: exit code with --format json");
        assert!(human.stderr.is_empty(), "{rel}: stderr: {}", human.stderr);
        assert!(human.stdout.contains("error: "), "{rel}: {}", human.stdout);
        let report: Value = serde_json::from_str(&json.stdout)
            .unwrap_or_else(|e| panic!("{rel}: JSON output does not parse: {e}\n{}", json.stdout));
        let diagnostics = check_json_report(&rel, &report);
        // Both formats report the same problems in the same order.
        let human_summaries: Vec<&str> = human
            .stdout
            .lines()
            .filter_map(|l| {
                l.strip_prefix("error: ")
                    .or_else(|| l.strip_prefix("warning: "))
            })
            .collect();
        let json_summaries: Vec<&str> = diagnostics
            .iter()
            .map(|d| d["summary"].as_str().unwrap())
            .collect();
        assert_eq!(human_summaries, json_summaries, "{rel}");

        let stem = file.replace('.', "_");
        let name = format!("invalid__{stem}");
        let snap_file = snapshots.join(format!("{SNAPSHOT_PREFIX}{stem}.snap"));
        if !updating && !snap_file.is_file() {
            failures.push(format!(
                "{rel}: no snapshot `{}`; run `INSTA_UPDATE=always cargo test --test integration validate` and review it",
                snap_file.display()
            ));
            continue;
        }
        let text = format!(
            "$ npc validate {rel}\nexit: {}\n{}\n$ npc validate {rel} --format json  (diagnostics)\n{}\n",
            human.code,
            human.stdout,
            serde_json::to_string_pretty(&diagnostics).unwrap()
        );
        let outcome = std::panic::catch_unwind(|| {
            insta::with_settings!({ prepend_module_to_snapshot => true, omit_expression => true }, {
                insta::assert_snapshot!(name.as_str(), text);
            });
        });
        if outcome.is_err() {
            failures.push(format!("{rel}: output differs from its snapshot"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// No snapshot is left behind for a fixture that was removed or renamed.
#[test]
fn every_snapshot_has_a_fixture() {
    let fixtures: Vec<String> = invalid_fixtures()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().replace('.', "_"))
        .collect();
    let snapshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/snapshots");
    for entry in std::fs::read_dir(&snapshots).expect("snapshot directory") {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let Some(stem) = name
            .strip_prefix(SNAPSHOT_PREFIX)
            .and_then(|s| s.strip_suffix(".snap"))
        else {
            continue;
        };
        assert!(
            fixtures.iter().any(|f| f == stem),
            "snapshot `{name}` has no fixture in {INVALID_DIR}; delete it"
        );
    }
}

#[test]
fn valid_fixtures_pass() {
    for fixture in ["fixtures/valid/full.toml", "fixtures/valid/minimal.json"] {
        let run = validate(&[fixture]);
        assert_eq!(run.code, 0, "{fixture}:\n{}{}", run.stdout, run.stderr);
        assert!(run.stdout.contains(": valid ("), "{}", run.stdout);
        let json = validate(&[fixture, "--format", "json"]);
        assert_eq!(json.code, 0);
        let report: Value = serde_json::from_str(&json.stdout).unwrap();
        assert_eq!(report["valid"], true);
        assert_eq!(report["error_count"], 0);
    }
    let full = validate(&["fixtures/valid/full.toml"]);
    // The summary, then where each trigger's runs work (`fixtures/valid`
    // is no git repository: in the checkout), then their sandboxes (on a
    // machine that can sandbox runs, as this one and CI).
    assert_eq!(
        full.stdout.trim_end(),
        "fixtures/valid/full.toml: valid (2 MCP servers, 2 providers, 2 profiles, 2 prompts, 2 hooks, 1 plugin, 4 triggers, 1 pane plugin, 1 pane)\n\
         trigger `issues` runs in the repository's checkout\n\
         trigger `nightly-review` runs in the repository's checkout\n\
         trigger `poll` runs in the repository's checkout\n\
         trigger `rebuild` runs in the repository's checkout\n\
         triggers `issues`, `nightly-review`: sandbox workspace (default)\n\
         triggers `poll`, `rebuild`: a command, run without a sandbox\n\
         profiles `reviewer`, `triager`: sandbox workspace (default) unattended, off (default) by hand"
    );
}

/// `fixtures/multi-error.toml` has twelve mistakes in twelve sections: one
/// run reports each of them, at its line, and nothing else.
#[test]
fn one_run_reports_every_problem() {
    let run = validate(&["fixtures/multi-error.toml", "--format", "json"]);
    assert_eq!(run.code, 1);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let diagnostics = check_json_report("multi-error", &report);
    let found: Vec<(u64, String)> = diagnostics
        .iter()
        .map(|d| {
            (
                d["range"]["start"]["line"].as_u64().unwrap(),
                d["summary"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: [(u64, &str); 12] = [
        (6, "`project.state_dir` is an absolute path"),
        (9, "unknown log level `verbose`"),
        (12, "unknown field `comand` in `mcp.servers.fs`"),
        (15, "invalid MCP server URL: plain `http`"),
        (18, "unknown provider kind `claude-code`"),
        (21, "prompt `review` uses undeclared variable `branch`"),
        (24, "unknown provider `gpt`"),
        (31, "hook `timeout_ms` `0` is out of range"),
        (34, "plugin directory `plugins/missing` does not exist"),
        (38, "invalid schedule `0 25 * * *`"),
        (43, "unknown restart policy `sometimes`"),
        (45, "invalid name `Main` in `panes`"),
    ];
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for ((line, summary), (want_line, want)) in found.iter().zip(expected) {
        assert_eq!(*line, want_line, "{summary}");
        assert!(
            summary.starts_with(want),
            "{summary:?} should start with {want:?}"
        );
    }
    assert_eq!(report["error_count"], 12);

    let human = validate(&["fixtures/multi-error.toml"]);
    assert_eq!(human.code, 1);
    assert!(
        human
            .stdout
            .ends_with("fixtures/multi-error.toml: invalid: 12 errors\n"),
        "{}",
        human.stdout
    );
}

#[test]
fn usage_and_io_errors_exit_2() {
    let missing = validate(&["fixtures/does-not-exist.toml"]);
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(
        missing
            .stderr
            .contains("cannot read `fixtures/does-not-exist.toml`"),
        "{}",
        missing.stderr
    );
    assert!(missing.stdout.is_empty());

    let dir = validate(&["fixtures"]);
    assert_eq!(dir.code, 2, "{}", dir.stderr);
    assert!(dir.stderr.contains("directory"), "{}", dir.stderr);

    let flag = validate(&["--frobnicate", "fixtures/valid/full.toml"]);
    assert_eq!(flag.code, 2, "{}", flag.stderr);
    assert!(flag.stderr.contains("--frobnicate"), "{}", flag.stderr);

    let format = validate(&["--format", "yaml", "fixtures/valid/full.toml"]);
    assert_eq!(format.code, 2, "{}", format.stderr);

    // No path, and no manifest in the working directory.
    let empty = tempfile::tempdir().unwrap();
    let out = npc()
        .current_dir(empty.path())
        .env_clear()
        .arg("validate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("npc init"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Write `bytes` as `name` in a fresh directory and validate it.
fn validate_bytes(name: &str, bytes: &[u8]) -> (tempfile::TempDir, Run) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    let run = validate(&[path.to_str().unwrap(), "--format", "json"]);
    (dir, run)
}

/// Summaries of the errors in a JSON report of a hostile file.
fn refused(what: &str, run: &Run) -> Vec<String> {
    assert_eq!(run.code, 1, "{what}: exit code\n{}", run.stderr);
    assert!(run.stderr.is_empty(), "{what}: {}", run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["valid"], false, "{what}");
    assert!(report["error_count"].as_u64().unwrap() >= 1, "{what}");
    report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["summary"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_50_mb_file_is_refused_without_reading_it() {
    const SIZE: usize = 50 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("npcagent.toml");
    let file = std::fs::File::create(&path).unwrap();
    // Sparse: 50 MB on paper, no 50 MB write.
    file.set_len(SIZE as u64).unwrap();
    drop(file);
    let run = validate(&[path.to_str().unwrap(), "--format", "json"]);
    let summaries = refused("50 MB", &run);
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert!(
        summaries[0].starts_with("manifest is larger than the limit of"),
        "{summaries:?}"
    );
}

#[test]
fn hostile_files_through_the_binary() {
    let deep = 10_000;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("npcagent.toml", Vec::new(), "missing field `version`"),
        ("npcagent.json", Vec::new(), "invalid JSON"),
        (
            "npcagent.toml",
            (0..=255u8).cycle().take(64 * 1024).collect(),
            "manifest is not valid UTF-8",
        ),
        (
            "npcagent.toml",
            b"version = 1\n\x00[project]\nname = \"a\x00b\"\n".to_vec(),
            "invalid TOML",
        ),
        (
            "npcagent.json",
            b"{\"version\": 1, \"project\": {\"name\": \"a\x00b\"}}".to_vec(),
            "invalid JSON",
        ),
        (
            "npcagent.toml",
            format!(
                "version = 1\nx = {}{}\n",
                "[".repeat(deep),
                "]".repeat(deep)
            )
            .into_bytes(),
            "invalid TOML",
        ),
        (
            "npcagent.toml",
            format!(
                "version = 1\nx = {}1{}\n",
                "{a = ".repeat(deep),
                "}".repeat(deep)
            )
            .into_bytes(),
            "invalid TOML",
        ),
        (
            "npcagent.json",
            format!("{}{}", "[".repeat(deep), "]".repeat(deep)).into_bytes(),
            "invalid JSON: nesting is deeper than",
        ),
        (
            "npcagent.json",
            format!("{}1{}", "{\"a\": ".repeat(deep), "}".repeat(deep)).into_bytes(),
            "invalid JSON: nesting is deeper than",
        ),
    ];
    for (i, (name, bytes, expected)) in cases.iter().enumerate() {
        let (_dir, run) = validate_bytes(name, bytes);
        let summaries = refused(&format!("case {i}"), &run);
        assert!(
            summaries.iter().any(|s| s.contains(expected)),
            "case {i}: {summaries:?}"
        );
    }
}

/// Thousands of problems on one very long line (minified JSON) stay cheap:
/// the report is capped and ends with a note saying so.
#[test]
fn many_problems_on_one_long_line_are_capped() {
    let keys: String = (0..10_000).map(|i| format!("\"k{i}\": 1, ")).collect();
    let text = format!("{{\"version\": 1, {keys}\"k0\": 2}}");
    let (_dir, run) = validate_bytes("npcagent.json", text.as_bytes());
    let summaries = refused("wide JSON", &run);
    assert_eq!(summaries.len(), 1001, "{}", summaries.len());
    assert!(summaries.last().unwrap().starts_with("too many problems"));
    assert!(summaries[0].starts_with("unknown top-level field `k0`"));
}

/// A command in a subdirectory finds its repository's manifest (named
/// relative to where it runs); `-m` and `NPC_MANIFEST` name another; the
/// search stops at the repository's root, so a manifest in a directory
/// that holds the repository is never taken.
#[test]
fn the_manifest_is_found_from_a_subdirectory_and_never_above_the_repository() {
    let outer = tempfile::tempdir().unwrap();
    let repo = outer.path().join("repo");
    let deep = repo.join("src/deep");
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::create_dir(repo.join(".git")).unwrap();
    std::fs::write(repo.join("npcagent.toml"), "version = 1\nbogus = 1\n").unwrap();
    let run = |dir: &Path, args: &[&str], env: Option<(&str, &Path)>| {
        let mut cmd = npc();
        cmd.current_dir(dir).env_remove("NPC_MANIFEST").args(args);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // From two levels down: the repository's manifest, named `../../`.
    let (code, stdout, stderr) = run(&deep, &["validate"], None);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("../../npcagent.toml:2:1"), "{stdout}");
    // `-m` on validate too, and `NPC_MANIFEST`.
    let good = outer.path().join("good.toml");
    std::fs::write(&good, "version = 1\n").unwrap();
    let (code, stdout, stderr) = run(&deep, &["validate", "-m", good.to_str().unwrap()], None);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let (code, stdout, stderr) = run(&deep, &["validate"], Some(("NPC_MANIFEST", &good)));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    // A nested repository without a manifest: the search ends at its root,
    // even though a directory above holds one.
    let nested = deep.join("vendor");
    std::fs::create_dir_all(nested.join(".git")).unwrap();
    let (code, _, stderr) = run(&nested, &["validate"], None);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("NPC_MANIFEST"), "{stderr}");
    // Plan from a subdirectory works on the repository, not the directory.
    std::fs::write(repo.join("npcagent.toml"), "version = 1\n").unwrap();
    let (code, stdout, stderr) = run(&deep, &["plan"], None);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(!deep.join(".npc").exists() && !repo.join("src/.npc").exists());
}

/// CI without the secrets: `--allow-missing-env` reports an unset `${VAR}`
/// as a warning and checks the rest; without it the manifest is invalid. A
/// malformed `${` stays an error either way.
#[test]
fn allow_missing_env_validates_without_the_secrets_and_checks_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("npcagent.toml");
    let text = "version = 1\n[providers.claude]\nkind = \"claude_code\"\nargs = [\"--url=${NPC_TEST_NEVER_SET_URL}\"]\nenv = { TOKEN = \"Bearer ${NPC_TEST_NEVER_SET_TOKEN}\" }\n";
    std::fs::write(&manifest, text).unwrap();
    let run = |args: &[&str]| {
        let out = npc()
            .current_dir(dir.path())
            .env_remove("NPC_TEST_NEVER_SET_URL")
            .env_remove("NPC_TEST_NEVER_SET_TOKEN")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, said) = run(&["validate"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("`NPC_TEST_NEVER_SET_URL` is not set"),
        "{said}"
    );
    let (code, said) = run(&["validate", "--allow-missing-env"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("warning"), "{said}");
    assert!(
        said.contains("`NPC_TEST_NEVER_SET_TOKEN` is not set"),
        "{said}"
    );
    // Everything else is still checked.
    std::fs::write(&manifest, format!("{text}bogus = 1\n")).unwrap();
    let (code, said) = run(&["validate", "--allow-missing-env"]);
    assert_eq!(code, Some(1), "{said}");
    std::fs::write(
        &manifest,
        "version = 1\n[mcp.servers.web]\nurl = \"${BROKEN\"\n",
    )
    .unwrap();
    let (code, said) = run(&["validate", "--allow-missing-env"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("malformed"), "{said}");
}
