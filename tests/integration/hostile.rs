//! Regression tests for a hostile repository: everything a repository
//! contains is untrusted input. One test per failure found, named after it,
//! each driving the real `npc` binary. Sections follow the numbered items of
//! the "safe in a hostile repository" issue.

#![allow(unused_imports)]

use crate::support::*;

// ---------------------------------------------------------------------------
// §1. one guarded layer for every file npc touches on a repository's behalf
//
// (tests for §1 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §2. templates cannot hang or exhaust the daemon
//
// (tests for §2 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §3. `npc import` never turns data into configuration
//
// (tests for §3 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §4. the daemon keeps serving and keeps converging
//
// (tests for §4 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §5. no orphans, fast shutdown
//
// (tests for §5 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §6. bounded memory on every input
//
// (tests for §6 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

/// `npc validate --format json` on `text` written as `name` in a fresh
/// directory, with `env` as the whole environment: exit code and report.
fn validate_json(name: &str, text: &[u8], env: &[(&str, &str)]) -> (i32, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    let out = npc()
        .current_dir(dir.path())
        .env_clear()
        .envs(env.iter().copied())
        .args(["validate", "--format", "json"])
        .arg(&path)
        .output()
        .unwrap();
    let code = out.status.code().expect("npc exited");
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (code, report)
}

/// Summaries of a validate report.
fn report_summaries(report: &serde_json::Value) -> Vec<String> {
    report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["summary"].as_str().unwrap().to_string())
        .collect()
}

/// A repository with `npc daemon` running in it (env cleared but for
/// `env`), stopped with SIGTERM on drop.
struct BoundedDaemon {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl BoundedDaemon {
    fn start(manifest: &str, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
        let child = std::process::Command::new(npc_path())
            .arg("daemon")
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let d = Self { dir, child };
        d.wait_event(0, "reconcile.applied");
        d
    }

    /// `npc events --format json`: every stored event, and the raw text.
    fn events(&self) -> (Vec<serde_json::Value>, String) {
        let out = npc()
            .current_dir(self.dir.path())
            .args(["events", "--format", "json"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let events = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (events, text)
    }

    fn wait_event(&self, after: i64, kind: &str) -> serde_json::Value {
        wait_for(&format!("a `{kind}` event after #{after}"), || {
            self.events()
                .0
                .into_iter()
                .find(|e| e["kind"] == kind && e["id"].as_i64().unwrap_or(0) > after)
        })
    }

    fn last_event_id(&self) -> i64 {
        self.events()
            .0
            .last()
            .and_then(|e| e["id"].as_i64())
            .unwrap_or(0)
    }

    fn write_manifest(&self, text: &str) {
        let tmp = self.dir.path().join(".npcagent.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("npcagent.toml")).unwrap();
    }
}

impl Drop for BoundedDaemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

#[test]
fn an_8_mb_array_of_ints_is_refused_by_the_item_cap() {
    let ones = "1,".repeat((8 * 1024 * 1024 - 64) / 2);
    let text = format!("version = 1\nx = [{ones}1]\n");
    let (code, report) = validate_json("npcagent.toml", text.as_bytes(), &[]);
    assert_eq!(code, 1);
    let summaries = report_summaries(&report);
    assert_eq!(
        summaries,
        [
            "the manifest has more items (keys, values, brackets) than 60000 plus one per 8 bytes of text (at most 200000)"
        ]
    );
    assert_eq!(report["diagnostics"][0]["range"]["start"]["line"], 2);
}

#[test]
fn millions_of_empty_args_are_refused() {
    // As many empty arguments as fit in the size limit (2.8 M)…
    let many = "\"\",".repeat((8 * 1024 * 1024 - 128) / 3);
    let text = format!("version = 1\n[mcp.servers.s]\ncommand = \"x\"\nargs = [{many}\"\"]\n");
    let (code, report) = validate_json("npcagent.toml", text.as_bytes(), &[]);
    assert_eq!(code, 1);
    assert_eq!(
        report_summaries(&report),
        [
            "the manifest has more items (keys, values, brackets) than 60000 plus one per 8 bytes of text (at most 200000)"
        ]
    );
    // …and any list past the per-array bound, in TOML and JSON alike.
    let args = vec!["\"\""; 4097].join(",");
    for (name, text) in [
        (
            "npcagent.toml",
            format!("version = 1\n[mcp.servers.s]\ncommand = \"x\"\nargs = [{args}]\n"),
        ),
        (
            "npcagent.json",
            format!(
                r#"{{"version": 1, "mcp": {{"servers": {{"s": {{"command": "x", "args": [{args}]}}}}}}}}"#
            ),
        ),
    ] {
        let (code, report) = validate_json(name, text.as_bytes(), &[]);
        assert_eq!(code, 1, "{name}");
        assert_eq!(
            report_summaries(&report),
            ["this array has more than 4096 items"],
            "{name}"
        );
    }
}

#[test]
fn a_string_past_the_bound_is_refused_in_both_syntaxes() {
    let long = "s".repeat(1024 * 1024 + 1);
    for (name, text) in [
        (
            "npcagent.toml",
            format!("version = 1\n[project]\nname = \"{long}\"\n"),
        ),
        (
            "npcagent.json",
            format!(r#"{{"version": 1, "project": {{"name": "{long}"}}}}"#),
        ),
    ] {
        let (code, report) = validate_json(name, text.as_bytes(), &[]);
        assert_eq!(code, 1, "{name}");
        assert_eq!(
            report_summaries(&report),
            ["this string is longer than 1048576 bytes"],
            "{name}"
        );
    }
}

#[test]
fn a_3_mb_diagnostics_report_is_stored_not_dropped() {
    let d = BoundedDaemon::start("version = 1\n", &[]);
    let mark = d.last_event_id();
    // 1,200 unknown fields, each named by a 3,000-character key: quoted in
    // full, the report was 3.6 MB and the event over the payload limit.
    let manifest: String = std::iter::once("version = 1\n".to_string())
        .chain((0..1200).map(|i| {
            format!(
                "[mcp.servers.s{i}]\ncommand = \"x\"\n{}{i} = 1\n",
                "k".repeat(3000)
            )
        }))
        .collect();
    d.write_manifest(&manifest);
    let invalid = d.wait_event(mark, "manifest.invalid");
    let payload = &invalid["payload"];
    assert!(
        payload.to_string().len() <= 1024 * 1024,
        "stored payload is {} bytes",
        payload.to_string().len()
    );
    let report = &payload["report"];
    assert!(
        report["error_count"].as_u64().unwrap() >= 1000,
        "{}",
        report["error_count"]
    );
    let diagnostics = report["diagnostics"].as_array().unwrap();
    let first = diagnostics[0]["summary"].as_str().unwrap();
    assert!(
        first.starts_with("unknown field `kkkk") && first.contains('…'),
        "{first}"
    );
    assert!(
        diagnostics.iter().all(|d| d.to_string().len() < 2000),
        "every diagnostic quotes a bounded prefix"
    );
}

// ---------------------------------------------------------------------------
// §7. redaction that is exact
//
// (tests for §7 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

#[test]
fn a_one_character_secret_does_not_mangle_keys_or_ids_in_stored_events() {
    const TOKEN: &str = "tok-9f3a7c51e2";
    let manifest = r#"version = 1
[mcp.servers.s1]
command = "sleep"
args = ["1000", "${LONG_TOKEN}"]
env = { RT_DEBUG = "${RT_DEBUG}", SERVER_TOKEN = "${LONG_TOKEN}" }
"#;
    let d = BoundedDaemon::start(manifest, &[("RT_DEBUG", "e"), ("LONG_TOKEN", TOKEN)]);
    let started = d.wait_event(0, "component.started");
    assert_eq!(started["component"], "mcp_server.s1", "{started}");
    let (events, text) = d.events();
    assert!(events.len() >= 2);
    assert!(
        !text.contains(TOKEN),
        "a real secret is never stored: {text}"
    );
    assert!(
        !text.contains("s<redacted>") && !text.contains("<redacted>rv"),
        "a one-character value was scrubbed inside other words: {text}"
    );
    for event in &events {
        // Keys and ids come back as written.
        for key in ["id", "kind", "payload"] {
            assert!(event.get(key).is_some(), "{event}");
        }
        let kind = event["kind"].as_str().unwrap();
        assert!(!kind.contains("redacted"), "{event}");
        if let Some(component) = event["component"].as_str() {
            assert!(!component.contains("redacted"), "{event}");
        }
    }
}

// ---------------------------------------------------------------------------
// §8. output and errors a user can act on
//
// (tests for §8 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

#[test]
fn a_nul_byte_in_an_argument_is_refused_by_validate() {
    for (what, manifest, summary) in [
        (
            "args",
            "version = 1\n[mcp.servers.s]\ncommand = \"x\"\nargs = [\"a\\u0000b\"]\n",
            "argument 1 contains a NUL byte",
        ),
        (
            "command",
            "version = 1\n[panes.p]\ncommand = \"x\\u0000y\"\n",
            "`command` contains a NUL byte",
        ),
        (
            "env",
            "version = 1\n[pane_plugins.p]\ncommand = \"x\"\nenv = { K = \"a\\u0000\" }\n",
            "environment value of `K` contains a NUL byte",
        ),
        (
            "cwd",
            "version = 1\n[mcp.servers.s]\ncommand = \"x\"\ncwd = \"d\\u0000\"\n",
            "`cwd` contains a NUL byte",
        ),
    ] {
        let (code, report) = validate_json("npcagent.toml", manifest.as_bytes(), &[]);
        assert_eq!(code, 1, "{what}");
        assert_eq!(report_summaries(&report), [summary], "{what}");
    }
}

#[test]
fn an_argument_list_longer_than_the_os_allows_is_refused_by_validate() {
    // One argument past MAX_ARG_STRLEN (131072 bytes with its NUL).
    let long = "a".repeat(131_072);
    let manifest = format!("version = 1\n[mcp.servers.s]\ncommand = \"x\"\nargs = [\"{long}\"]\n");
    let (code, report) = validate_json("npcagent.toml", manifest.as_bytes(), &[]);
    assert_eq!(code, 1);
    assert_eq!(
        report_summaries(&report),
        ["argument 1 is 131072 bytes, more than the 131071 the OS passes in one argument"]
    );
    // Many arguments, each allowed, together past what a program can be given.
    let arg = format!("\"{}\"", "a".repeat(100_000));
    let args = vec![arg; 20].join(",");
    let manifest = format!("version = 1\n[providers.p]\nkind = \"codex\"\nargs = [{args}]\n");
    let (code, report) = validate_json("npcagent.toml", manifest.as_bytes(), &[]);
    assert_eq!(code, 1);
    let summaries = report_summaries(&report);
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert!(
        summaries[0].starts_with("the arguments and environment of `codex` take "),
        "{summaries:?}"
    );
}

#[test]
fn an_unset_variable_and_another_error_in_the_same_entry_are_both_reported() {
    let manifest = "version = 1\n[mcp.servers.s]\ncommand = \"x\"\nargs = [\"${UNSET_VAR}\"]\ncwd = \"../outside\"\nenv = { K = \"a\\u0000\" }\n";
    let (code, report) = validate_json("npcagent.toml", manifest.as_bytes(), &[]);
    assert_eq!(code, 1);
    assert_eq!(
        report_summaries(&report),
        [
            "environment variable `UNSET_VAR` is not set",
            "`cwd` leaves the repository",
            "environment value of `K` contains a NUL byte",
        ]
    );
}

#[test]
fn an_env_derived_url_with_a_bad_scheme_is_reported_with_the_value_redacted() {
    let manifest = "version = 1\n[mcp.servers.s]\nurl = \"${MCP_URL}\"\n";
    for (value, problem) in [
        (
            "ftp://secret-place.example/token",
            "unsupported scheme `<redacted>`",
        ),
        (
            "http://192.168.7.7/secret-place",
            "plain `http` to `<redacted>`, which is not loopback",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
        let out = npc()
            .current_dir(dir.path())
            .env_clear()
            .env("MCP_URL", value)
            .arg("validate")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let shown = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            shown.contains(&format!(
                "invalid MCP server URL from `${{MCP_URL}}`: {problem}"
            )),
            "{shown}"
        );
        assert!(
            !shown.contains("secret-place") && !shown.contains("192.168"),
            "{shown}"
        );
    }
}

// ---------------------------------------------------------------------------
// §9. correctness found by the audit
//
// (tests for §9 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §10. what the agent CLIs accept
//
// (tests for §10 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------
