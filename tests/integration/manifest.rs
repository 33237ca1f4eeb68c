//! The shipped examples, the committed JSON Schema, and the commands around
//! them (`npc schema`, `npc init`, `npc completions`, `npc --version`).

use std::collections::BTreeMap;

use npcagent::disk::DiskFiles;
use npcagent::model::{self, Syntax};

use crate::support::{npc, repo_root};

fn load_example(name: &str) -> model::Manifest {
    let path = repo_root().join("examples").join(name);
    let env: BTreeMap<String, String> = BTreeMap::new();
    let loaded = npcagent::plugins::files::load_path(&path, &env).expect("example is readable");
    assert!(
        loaded.manifest.is_some(),
        "{name} is invalid: {:#?}",
        loaded
            .diagnostics
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    );
    loaded.manifest.unwrap()
}

#[test]
fn committed_schema_is_the_generated_one() {
    let generated = npcagent::model::json_schema();
    crate::support::committed_is_generated(
        "schemas/npcagent.schema.json",
        &serde_json::to_string_pretty(&generated).unwrap(),
    );
    if crate::support::updating_generated() {
        return;
    }
    // The binary prints the committed text it carries.
    let committed =
        std::fs::read_to_string(repo_root().join("schemas/npcagent.schema.json")).unwrap();
    let printed = npc()
        .arg("schema")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(
        committed.trim_end(),
        String::from_utf8(printed).unwrap().trim_end()
    );
}

#[test]
fn every_example_validates_against_the_schema() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("schemas/npcagent.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let mut checked = 0;
    for entry in std::fs::read_dir(repo_root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        let text = match path.extension().and_then(|e| e.to_str()) {
            Some("toml" | "json") => std::fs::read_to_string(&path).unwrap(),
            _ => continue,
        };
        let value: serde_json::Value = if path.extension().unwrap() == "toml" {
            toml::from_str(&text).unwrap()
        } else {
            serde_json::from_str(&text).unwrap()
        };
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{} does not match the schema: {errors:#?}",
            path.display()
        );
        checked += 1;
    }
    assert!(
        checked >= 3,
        "expected the TOML and JSON examples, checked {checked}"
    );
}

#[test]
fn schema_rejects_what_npc_rejects() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("schemas/npcagent.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for bad in [
        serde_json::json!({"version": 1, "mcp": {"servers": {"fs": {"comand": "x"}}}}),
        serde_json::json!({"version": 2}),
        serde_json::json!({"version": 1, "providers": {"Bad Name": {"kind": "codex"}}}),
        serde_json::json!({"version": 1, "providers": {"c": {"kind": "cursor"}}}),
        serde_json::json!({"version": 1, "hooks": {"before_tool": [{"command": "x", "timeout_ms": 30001}]}}),
    ] {
        assert!(!validator.is_valid(&bad), "schema accepted {bad}");
    }
}

#[test]
fn toml_and_json_examples_lower_to_equal_models() {
    assert_eq!(load_example("full.toml"), load_example("full.json"));
}

#[test]
fn models_compare_by_meaning_not_spelling() {
    let env: BTreeMap<String, String> = BTreeMap::new();
    let files = DiskFiles::new(repo_root().to_path_buf());
    let a = model::load_bytes(
        "a.toml",
        b"version = 1\n[triggers.t]\nkind = \"cron\"\nschedule = \"0 9 * * mon-fri\"\naction = { command = \"make\" }\n",
        Syntax::Toml,
        &env,
        &files,
    );
    let b = model::load_bytes(
        "b.toml",
        b"version = 1\n\n\n[triggers.t]\naction.command = \"make\"\nschedule = \"0 9 * * 1-5\"\nkind = \"cron\"\n",
        Syntax::Toml,
        &env,
        &files,
    );
    assert_eq!(a.manifest.unwrap(), b.manifest.unwrap());
}

#[test]
fn validate_prints_a_summary_for_valid_examples() {
    let out = npc()
        .current_dir(repo_root())
        .args(["validate", "examples/full.toml"])
        .assert()
        .success();
    let stdout = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    insta::assert_snapshot!(stdout, @r"
    examples/full.toml: valid (3 MCP servers, 4 providers, 4 profiles, 3 prompts, 3 hooks, 1 plugin, 4 triggers, 1 pane plugin, 2 panes, 1 notification sink)
    trigger `docs-changed` runs in the repository's checkout
    trigger `github` runs in the repository's checkout
    trigger `lint-often` runs in the repository's checkout
    trigger `nightly-tests` runs in the repository's checkout
    triggers `docs-changed`, `github`, `nightly-tests`: sandbox workspace (default)
    trigger `lint-often`: a command, run without a sandbox
    profiles `refactorer`, `reviewer`, `tester`, `triager`: sandbox workspace (default) unattended, off (default) by hand
    ");
}

#[test]
fn secrets_from_the_environment_print_redacted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[mcp.servers.s]\ncommand = \"srv\"\nenv = { TOKEN = \"${NPC_TEST_SECRET}\" }\nargs = [\"--token=${NPC_TEST_SECRET}\"]\n",
    )
    .unwrap();
    let env: BTreeMap<String, String> =
        [("NPC_TEST_SECRET".to_string(), "hunter2-secret".to_string())].into();
    let loaded =
        npcagent::plugins::files::load_path(&dir.path().join("npcagent.toml"), &env).unwrap();
    let manifest = loaded.manifest.expect("valid");
    let debug = format!("{manifest:?}");
    let json = serde_json::to_string(&manifest).unwrap();
    assert!(
        !debug.contains("hunter2") && !json.contains("hunter2"),
        "secret leaked: {debug}\n{json}"
    );
    assert!(json.contains("<redacted>"));
}

#[test]
fn unset_variable_is_a_diagnostic_at_its_location() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), "version = 1\n[providers.c]\nkind = \"claude_code\"\nargs = [\"--a\", \"x=${NPC_SURELY_UNSET_VAR}\"]\n").unwrap();
    let out = npc()
        .current_dir(dir.path())
        .env_remove("NPC_SURELY_UNSET_VAR")
        .args(["validate"])
        .assert()
        .code(1);
    let stdout = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        stdout.contains("environment variable `NPC_SURELY_UNSET_VAR` is not set"),
        "{stdout}"
    );
    assert!(stdout.contains(" --> npcagent.toml:4:19"), "{stdout}");
}

#[test]
fn init_writes_a_valid_manifest_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    npc().args(["init"]).arg(dir.path()).assert().success();
    let text = std::fs::read_to_string(dir.path().join("npcagent.toml")).unwrap();
    assert!(
        text.starts_with("#:schema ./.npc/npcagent.schema.json\n"),
        "{text}"
    );
    let schema = std::fs::read_to_string(dir.path().join(".npc/npcagent.schema.json")).unwrap();
    assert_eq!(
        schema.trim_end(),
        std::fs::read_to_string(repo_root().join("schemas/npcagent.schema.json"))
            .unwrap()
            .trim_end()
    );
    npc()
        .current_dir(dir.path())
        .args(["validate"])
        .assert()
        .success();
    std::fs::write(dir.path().join("npcagent.toml"), "# mine\n").unwrap();
    npc()
        .args(["init"])
        .arg(dir.path())
        .assert()
        .code(2)
        .stderr(predicates::str::contains("already exists"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("npcagent.toml")).unwrap(),
        "# mine\n"
    );
}

#[test]
fn version_help_and_completions() {
    npc()
        .arg("--version")
        .assert()
        .success()
        .stdout(predicates::str::contains(env!("CARGO_PKG_VERSION")));
    npc()
        .arg("help")
        .assert()
        .success()
        .stdout(predicates::str::contains("validate"));
    for shell in ["bash", "zsh", "fish"] {
        npc()
            .args(["completions", shell])
            .assert()
            .success()
            .stdout(predicates::str::contains("validate"));
    }
    npc().args(["completions", "tcsh-nope"]).assert().code(2);
}

#[test]
fn committed_man_pages_are_the_generated_ones() {
    let out = tempfile::tempdir().unwrap();
    npc()
        .args(["man", "--out"])
        .arg(out.path())
        .assert()
        .success();
    let list = |root: &std::path::Path| {
        let mut files = Vec::new();
        for section in ["man1", "man5"] {
            for entry in std::fs::read_dir(root.join(section)).unwrap() {
                files.push(format!(
                    "{section}/{}",
                    entry.unwrap().file_name().to_string_lossy()
                ));
            }
        }
        files.sort();
        files
    };
    let committed = repo_root().join("man");
    let stale = "man/ is stale: run `cargo run -- man --out man`";
    assert_eq!(list(out.path()), list(&committed), "{stale}");
    for file in list(&committed) {
        assert_eq!(
            std::fs::read_to_string(out.path().join(&file)).unwrap(),
            std::fs::read_to_string(committed.join(&file)).unwrap(),
            "{file}: {stale}"
        );
    }
    let page = std::fs::read_to_string(committed.join("man5/npcagent.toml.5")).unwrap();
    for section in ["mcp", "triggers", "panes", "daemon"] {
        assert!(page.contains(&format!(".SS {section}\n")), "{section}");
    }
}

/// Copy the directory `from` into `to`, recursively (regular files and
/// directories only; the examples hold nothing else).
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Every manifest shipped under `examples/` (`examples/*.toml`,
/// `examples/*.json`, `examples/*/npcagent.toml`) is valid AND applies: in a
/// fresh git repository holding a copy of the example's directory,
/// `npc validate` and `npc apply --auto-approve` succeed with no error and
/// no file left untouched, and the plan afterwards has no changes. (The
/// full example once validated but its `/review` command failed to render.)
#[test]
fn every_example_manifest_validates_and_applies() {
    let examples = repo_root().join("examples");
    let mut manifests = Vec::new();
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("toml" | "json") => manifests.push((examples.clone(), path)),
            _ if path.join("npcagent.toml").is_file() => {
                manifests.push((path.clone(), path.join("npcagent.toml")))
            }
            _ => {}
        }
    }
    manifests.sort();
    assert!(manifests.len() >= 5, "{manifests:?}");
    for (dir, manifest) in manifests {
        let shown = manifest.strip_prefix(repo_root()).unwrap().display();
        let repo = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        copy_tree(&dir, repo.path());
        let name = match manifest.extension().and_then(|e| e.to_str()) {
            Some("json") => "npcagent.json",
            _ => "npcagent.toml",
        };
        for other in ["npcagent.toml", "npcagent.json"] {
            let _ = std::fs::remove_file(repo.path().join(other));
        }
        std::fs::copy(&manifest, repo.path().join(name)).unwrap();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(["-c", "user.name=npc", "-c", "user.email=npc@localhost"])
                .args(args)
                .current_dir(repo.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "git {args:?}: {out:?}");
        };
        git(&["init", "-q"]);
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "example"]);
        let run = |args: &[&str]| {
            let out = npc()
                .current_dir(repo.path())
                .args(args)
                .env("XDG_DATA_HOME", data.path())
                .env("NPC_STORE_URL", "postgres://npc:example@127.0.0.1:9/npc")
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            (out.status.code(), said)
        };
        let (code, said) = run(&["validate"]);
        assert_eq!(code, Some(0), "{shown}: validate: {said}");
        let (code, said) = run(&["apply", "--auto-approve"]);
        assert_eq!(code, Some(0), "{shown}: apply: {said}");
        assert!(
            !said
                .lines()
                .any(|l| l.starts_with("error") || l.trim_start().starts_with("! ")),
            "{shown}: apply left an error or an untouched file: {said}"
        );
        let (code, said) = run(&["plan", "--detailed-exitcode"]);
        assert_eq!(code, Some(0), "{shown}: plan after apply: {said}");
    }
}
