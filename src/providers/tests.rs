//! Tests of the providers' parsers against the recorded fixtures, drift
//! switching, and hostile input.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use proptest::prelude::{Just, ProptestConfig, any, prop_assert, prop_oneof, proptest};
use proptest::strategy::Strategy as _;

use super::*;

fn fixture(kind: ProviderKind, version: &str, name: &str) -> Vec<u8> {
    let path: PathBuf = source_fixtures_root()
        .join(kind.as_str())
        .join(version)
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse_all(kind: ProviderKind, bytes: &[u8]) -> Vec<AgentEvent> {
    let mut p = Parser::new(kind, Some(source_fixtures_root()));
    let mut out = p.feed(bytes);
    out.extend(p.finish());
    out
}

fn types(events: &[AgentEvent]) -> Vec<&'static str> {
    events.iter().map(AgentEvent::type_name).collect()
}

const CLAUDE: &str = "2.1.197";
const CODEX: &str = "0.171.0";
const GEMINI: &str = "0.61.0";
const OPENCODE: &str = "1.18.33";

#[test]
fn claude_tool_call_fixture() {
    let ev = parse_all(
        ProviderKind::ClaudeCode,
        &fixture(ProviderKind::ClaudeCode, CLAUDE, "tool_call.jsonl"),
    );
    assert_eq!(
        types(&ev),
        [
            "agent.started",
            "agent.message",
            "agent.tool_call",
            "agent.tool_result",
            "agent.message",
            "agent.usage",
            "agent.idle"
        ]
    );
    assert_eq!(
        ev[3],
        AgentEvent::ToolResult {
            id: Some("toolu_01".into()),
            name: Some("Bash".into()),
            output: "Cargo.toml\nsrc".into(),
            is_error: false
        }
    );
    assert_eq!(
        ev[5],
        AgentEvent::Usage {
            input_tokens: Some(70),
            output_tokens: Some(13),
            cached_input_tokens: Some(10),
            cost_usd: Some(0.0062)
        }
    );
}

#[test]
fn claude_error_result_is_an_error_and_an_idle() {
    let ev = parse_all(
        ProviderKind::ClaudeCode,
        &fixture(ProviderKind::ClaudeCode, CLAUDE, "error_max_turns.jsonl"),
    );
    assert_eq!(
        types(&ev),
        ["agent.started", "agent.error", "agent.usage", "agent.idle"]
    );
    assert!(
        matches!(&ev[3], AgentEvent::Idle { status, is_error: true, .. } if status == "error_max_turns")
    );
}

#[test]
fn codex_fixtures() {
    let ev = parse_all(
        ProviderKind::Codex,
        &fixture(ProviderKind::Codex, CODEX, "tool_call.jsonl"),
    );
    assert_eq!(
        types(&ev),
        [
            "agent.started",
            "agent.tool_call",
            "agent.tool_result",
            "agent.tool_call",
            "agent.tool_result",
            "agent.message",
            "agent.usage",
            "agent.idle"
        ]
    );
    assert!(matches!(&ev[3], AgentEvent::ToolCall { name, .. } if name == "fs.read_file"));
    assert!(
        matches!(&ev[4], AgentEvent::ToolResult { output, is_error: false, .. } if output.contains("# npc"))
    );
    let ev = parse_all(
        ProviderKind::Codex,
        &fixture(ProviderKind::Codex, CODEX, "file_change.jsonl"),
    );
    assert_eq!(
        types(&ev),
        [
            "agent.started",
            "agent.tool_call",
            "agent.tool_result",
            "agent.message",
            "agent.usage",
            "agent.idle"
        ]
    );
    let ev = parse_all(
        ProviderKind::Codex,
        &fixture(ProviderKind::Codex, CODEX, "turn_failed.jsonl"),
    );
    assert_eq!(
        types(&ev),
        ["agent.started", "agent.error", "agent.error", "agent.idle"]
    );
}

#[test]
fn gemini_fixtures() {
    let ev = parse_all(
        ProviderKind::GeminiCli,
        &fixture(ProviderKind::GeminiCli, GEMINI, "tool_call.jsonl"),
    );
    assert_eq!(
        types(&ev),
        [
            "agent.started",
            "agent.tool_call",
            "agent.tool_result",
            "agent.tool_call",
            "agent.tool_result",
            "agent.message",
            "agent.usage",
            "agent.idle"
        ]
    );
    assert_eq!(
        ev[4],
        AgentEvent::ToolResult {
            id: Some("read_file-2".into()),
            name: Some("read_file".into()),
            output: "File not found: /repo/missing".into(),
            is_error: true
        }
    );
    let ev = parse_all(
        ProviderKind::GeminiCli,
        &fixture(ProviderKind::GeminiCli, GEMINI, "boot.jsonl"),
    );
    assert_eq!(
        types(&ev),
        ["agent.started", "agent.message", "agent.message"]
    );
    assert!(matches!(&ev[1], AgentEvent::Message { delta: true, .. }));
    let ev = parse_all(
        ProviderKind::GeminiCli,
        &fixture(ProviderKind::GeminiCli, GEMINI, "error.jsonl"),
    );
    assert_eq!(
        types(&ev),
        [
            "agent.started",
            "agent.error",
            "agent.error",
            "agent.usage",
            "agent.idle"
        ]
    );
}

#[test]
fn opencode_fixtures() {
    let ev = parse_all(
        ProviderKind::Opencode,
        &fixture(ProviderKind::Opencode, OPENCODE, "tool_call.jsonl"),
    );
    assert_eq!(
        types(&ev),
        [
            "agent.started",
            "agent.tool_call",
            "agent.tool_result",
            "agent.usage",
            "agent.message",
            "agent.usage",
            "agent.idle"
        ]
    );
    assert!(
        matches!(&ev[5], AgentEvent::Usage { cost_usd: Some(c), cached_input_tokens: Some(512), .. } if (*c - 0.0011).abs() < 1e-12)
    );
    let ev = parse_all(
        ProviderKind::Opencode,
        &fixture(ProviderKind::Opencode, OPENCODE, "error.jsonl"),
    );
    assert_eq!(types(&ev), ["agent.started", "agent.error"]);
    assert!(
        matches!(&ev[1], AgentEvent::Error { kind: ErrorKind::Provider, message } if message == "model not found")
    );
}

#[test]
fn every_fixture_parses_without_drift_or_skipped_lines() {
    for (kind, version) in [
        (ProviderKind::ClaudeCode, CLAUDE),
        (ProviderKind::Codex, CODEX),
        (ProviderKind::GeminiCli, GEMINI),
        (ProviderKind::Opencode, OPENCODE),
    ] {
        let dir = source_fixtures_root().join(kind.as_str()).join(version);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "jsonl") {
                continue;
            }
            let ev = parse_all(kind, &std::fs::read(&path).unwrap());
            assert!(
                ev.iter().any(|e| matches!(e, AgentEvent::Started { .. })),
                "{}",
                path.display()
            );
            for e in &ev {
                assert!(
                    !matches!(
                        e,
                        AgentEvent::DriftDetected { .. }
                            | AgentEvent::Error {
                                kind: ErrorKind::NotJson
                                    | ErrorKind::UnknownEvent
                                    | ErrorKind::Detection,
                                ..
                            }
                    ),
                    "{}: {e:?}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn the_newest_fixture_version_is_the_baseline_in_semver_order() {
    let p = Parser::new(ProviderKind::Codex, Some(source_fixtures_root()));
    // "0.9.0" sorts after "0.171.0" as a string; semver says otherwise.
    assert_eq!(p.baseline_version(), Some(CODEX));
    let p = Parser::new(ProviderKind::ClaudeCode, Some(source_fixtures_root()));
    assert_eq!(p.baseline_version(), Some(CLAUDE));
}

#[test]
fn serializes_with_type_names() {
    let e = AgentEvent::ToolCall {
        id: Some("1".into()),
        name: "Bash".into(),
        input: serde_json::json!({"command": "ls"}),
    };
    assert_eq!(
        serde_json::to_value(&e).unwrap(),
        serde_json::json!({"type": "agent.tool_call", "id": "1", "name": "Bash", "input": {"command": "ls"}})
    );
    let d = AgentEvent::DriftDetected {
        provider: ProviderKind::Codex,
        ratio: 0.5,
        threshold: DRIFT_THRESHOLD,
        fixture_version: "1.0.0".into(),
        from: Strategy::NativeJson,
        to: Strategy::CaptureDiffFallback,
    };
    let v = serde_json::to_value(&d).unwrap();
    assert_eq!(v["type"], "cli_detection.drift_detected");
    assert_eq!(v["provider"], "codex");
    assert_eq!(v["from"], "native_json");
    assert_eq!(v["to"], "capture_diff_fallback");
}

#[test]
fn chunk_boundaries_do_not_matter() {
    let bytes = fixture(ProviderKind::Codex, CODEX, "tool_call.jsonl");
    let whole = parse_all(ProviderKind::Codex, &bytes);
    let mut p = Parser::new(ProviderKind::Codex, Some(source_fixtures_root()));
    let mut bytewise = Vec::new();
    for b in &bytes {
        bytewise.extend(p.feed(std::slice::from_ref(b)));
    }
    bytewise.extend(p.finish());
    assert_eq!(whole, bytewise);
}

/// Codex printing the marker format: the native reader's first lines are
/// held, the guard sees drift, and the chain ends at the regex fallback
/// with no line lost.
#[test]
fn codex_marker_output_drifts_to_the_regex_fallback() {
    let ev = parse_all(
        ProviderKind::Codex,
        &fixture(ProviderKind::Codex, CODEX, "markers.txt"),
    );
    let drifts: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            AgentEvent::DriftDetected {
                from, to, ratio, ..
            } => Some((*from, *to, *ratio)),
            _ => None,
        })
        .collect();
    assert_eq!(drifts.len(), 2, "{ev:#?}");
    assert_eq!(
        (drifts[0].0, drifts[0].1),
        (Strategy::NativeJson, Strategy::CaptureDiffFallback)
    );
    assert_eq!(
        (drifts[1].0, drifts[1].1),
        (Strategy::CaptureDiffFallback, Strategy::RegexFallback)
    );
    assert!(drifts.iter().all(|d| d.2 < DRIFT_THRESHOLD));
    let rest: Vec<_> = ev
        .iter()
        .filter(|e| !matches!(e, AgentEvent::DriftDetected { .. }))
        .map(AgentEvent::type_name)
        .collect();
    assert_eq!(
        rest,
        [
            "agent.message",
            "agent.tool_call",
            "agent.tool_result",
            "agent.message",
            "agent.message",
            "agent.idle"
        ]
    );
}

/// JSON output of the shape the fixture has stays on the native strategy
/// even when a few lines are not JSON (ratio above the threshold), and
/// those lines are reported as skipped.
#[test]
fn a_few_stray_lines_stay_above_the_threshold() {
    let good = fixture(ProviderKind::Codex, CODEX, "tool_call.jsonl");
    let mut input = good.clone();
    input.extend_from_slice(b"warning: something odd\n");
    input.extend_from_slice(&good);
    let mut p = Parser::new(ProviderKind::Codex, Some(source_fixtures_root()));
    let mut ev = p.feed(&input);
    ev.extend(p.finish());
    assert_eq!(p.strategy(), Strategy::NativeJson);
    assert!(
        !ev.iter()
            .any(|e| matches!(e, AgentEvent::DriftDetected { .. }))
    );
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(
                e,
                AgentEvent::Error {
                    kind: ErrorKind::NotJson,
                    ..
                }
            ))
            .count(),
        1
    );
}

/// Below the threshold: after clean lines, a run of text pushes the
/// window's mean under 0.72 and the parser moves on.
#[test]
fn a_run_of_text_falls_below_the_threshold() {
    // A turn still running: the fixture without its final `step_finish`.
    let all =
        String::from_utf8(fixture(ProviderKind::Opencode, OPENCODE, "tool_call.jsonl")).unwrap();
    let lines: Vec<&str> = all.lines().collect();
    let good = lines[..lines.len() - 1].join("\n") + "\n";
    let mut p = Parser::new(ProviderKind::Opencode, Some(source_fixtures_root()));
    let mut ev = p.feed(good.as_bytes());
    assert!(!p.is_idle());
    assert_eq!(p.strategy(), Strategy::NativeNdjson);
    for i in 0..DRIFT_WINDOW_LINES {
        ev.extend(p.feed(format!("plain line {i}\n").as_bytes()));
    }
    ev.extend(p.finish());
    assert_eq!(p.strategy(), Strategy::CaptureDiffFallback);
    let drift = ev.iter().find_map(|e| match e {
        AgentEvent::DriftDetected { ratio, .. } => Some(*ratio),
        _ => None,
    });
    assert!(drift.is_some_and(|r| r < DRIFT_THRESHOLD), "{ev:#?}");
    // after the switch, text lines arrive as messages
    assert!(
        matches!(ev.last(), Some(AgentEvent::Message { text, .. }) if text == &format!("plain line {}", DRIFT_WINDOW_LINES - 1))
    );
}

/// What a CLI prints after its final result (Gemini's stack trace of an MCP
/// server it was still starting when the turn ended, seen under load) is
/// not drift, however long; JSON of an unknown shape after it still is.
#[test]
fn text_after_the_idle_result_is_not_drift() {
    let good = fixture(ProviderKind::GeminiCli, GEMINI, "idle.jsonl");
    let mut p = Parser::new(ProviderKind::GeminiCli, Some(source_fixtures_root()));
    let mut ev = p.feed(&good);
    assert!(p.is_idle(), "{ev:#?}");
    let mut trace =
        b"[MCP error] Error discovering tools from npc: MCP error -32000: Connection closed\n"
            .to_vec();
    for i in 0..2 * DRIFT_WINDOW_LINES {
        trace.extend_from_slice(format!("    at frame{i} (file:///bundle.js:{i}:12)\n").as_bytes());
    }
    ev.extend(p.feed(&trace));
    assert!(
        !ev.iter()
            .any(|e| matches!(e, AgentEvent::DriftDetected { .. })),
        "{ev:#?}"
    );
    assert!(ev.iter().any(|e| matches!(
        e,
        AgentEvent::Error {
            kind: ErrorKind::NotJson,
            ..
        }
    )));
    for i in 0..DRIFT_WINDOW_LINES {
        ev.extend(p.feed(format!("{{\"kind\":\"renamed\",\"n{i}\":1}}\n").as_bytes()));
    }
    ev.extend(p.finish());
    assert!(
        ev.iter()
            .any(|e| matches!(e, AgentEvent::DriftDetected { .. })),
        "{ev:#?}"
    );
}

#[test]
fn the_last_capture_strategy_passes_any_line_on_as_text() {
    let mut p = Parser::new(ProviderKind::Opencode, Some(source_fixtures_root()));
    let mut ev = p.feed(b"one\ntwo\nthree\nfour\n");
    assert_eq!(p.strategy(), Strategy::CaptureDiffFallback);
    ev.extend(
        p.feed(b"42\n{\"type\":\"text\",\"part\":{\"text\":\"json still reads\"}}\nReady.\n"),
    );
    let texts: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Message { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        texts,
        ["one", "two", "three", "four", "42", "json still reads"]
    );
    assert!(matches!(ev.last(), Some(AgentEvent::Idle { .. })));
}

#[test]
fn gemini_interactive_screen_drifts_to_probe_on_stale() {
    let ev = parse_all(
        ProviderKind::GeminiCli,
        &fixture(ProviderKind::GeminiCli, GEMINI, "interactive.txt"),
    );
    assert!(matches!(
        ev.first(),
        Some(AgentEvent::DriftDetected {
            from: Strategy::CaptureDiffFallback,
            to: Strategy::ProbeOnStale,
            ..
        })
    ));
    assert_eq!(
        types(&ev[1..]),
        [
            "agent.message",
            "agent.message",
            "agent.message",
            "agent.message",
            "agent.idle"
        ]
    );
    assert!(matches!(&ev[1], AgentEvent::Message { text, .. } if text == "Gemini CLI"));
}

#[test]
fn without_fixtures_there_is_no_guard_and_no_switch() {
    let mut p = Parser::new(ProviderKind::Codex, None);
    let mut ev = p.feed(b"[ASSISTANT] hi\n[IDLE]\n[IDLE]\n[IDLE]\n[IDLE]\n");
    ev.extend(p.finish());
    assert_eq!(p.strategy(), Strategy::NativeJson);
    assert!(ev.iter().all(|e| matches!(
        e,
        AgentEvent::Error {
            kind: ErrorKind::NotJson,
            ..
        }
    )));
}

#[test]
fn an_unreadable_fixture_root_is_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let version = dir.path().join("codex").join("1.0.0");
    std::fs::create_dir_all(&version).unwrap();
    let mut p = Parser::new(ProviderKind::Codex, Some(dir.path()));
    let ev = p.feed(b"");
    assert!(
        matches!(
            &ev[..],
            [AgentEvent::Error {
                kind: ErrorKind::Detection,
                ..
            }]
        ),
        "{ev:?}"
    );
    assert!(p.feed(b"").is_empty());
    assert_eq!(p.baseline_version(), None);
}

#[test]
fn hostile_lines_become_errors() {
    let mut p = Parser::new(ProviderKind::ClaudeCode, None).with_line_limit(64);
    let mut input = Vec::new();
    input.extend_from_slice(b"{\"type\":\"mystery\"}\n");
    input.extend_from_slice(b"[1,2]\n");
    input.extend_from_slice(b"\xff\xfe{\"type\":\"system\"}\n");
    input.extend_from_slice(&[b'x'; 500]);
    input.extend_from_slice(b"\n{\"type\":\"system\",\"subtype\":\"init\",\"session_id\":\"s\"}\n");
    input.extend_from_slice(b"{\"type\":\"assistant\",\"mess");
    let mut ev = p.feed(&input);
    ev.extend(p.feed_stderr(b"Warning: slow\npartial"));
    ev.extend(p.finish());
    let kinds: Vec<_> = ev
        .iter()
        .map(|e| match e {
            AgentEvent::Error { kind, .. } => format!("{kind:?}"),
            other => other.type_name().to_string(),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "UnknownEvent",
            "UnknownEvent",
            "InvalidUtf8",
            "LineTooLong",
            "agent.started",
            "Stderr",
            "Truncated",
            "Stderr"
        ]
    );
}

#[test]
fn stale_detection_is_advisory_and_resets() {
    let t0 = Instant::now();
    let mut p = Parser::new(ProviderKind::GeminiCli, None);
    p.feed_at(b"{\"type\":\"init\",\"session_id\":\"g\"}\n", t0);
    assert!(!p.needs_probe(t0 + STALE_AFTER - Duration::from_millis(1)));
    assert!(p.needs_probe(t0 + STALE_AFTER));
    p.probe_sent(t0 + STALE_AFTER);
    assert!(!p.needs_probe(t0 + STALE_AFTER * 3));
    let t1 = t0 + STALE_AFTER * 4;
    p.feed_at(b"{\"type\":\"result\",\"status\":\"success\"}\n", t1);
    assert!(p.is_idle());
    assert!(
        !p.needs_probe(t1 + STALE_AFTER * 10),
        "idle agents are not stale"
    );
    // providers without probe_on_stale never ask
    let c = Parser::new(ProviderKind::ClaudeCode, None);
    assert!(!c.needs_probe(t0 + STALE_AFTER * 100));
}

fn hostile_lines() -> impl proptest::strategy::Strategy<Value = Vec<Vec<u8>>> {
    let line = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..80),
        "[a-z{}\\[\\]\":,0-9 ]{0,60}".prop_map(String::into_bytes),
        Just(b"{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"tool_use\"}]}}".to_vec()),
        Just(b"{\"type\":\"item.completed\",\"item\":{\"type\":\"command_execution\",\"exit_code\":\"x\"}}".to_vec()),
        Just(b"{\"type\":\"tool_use\",\"part\":{\"state\":{\"status\":\"error\",\"error\":7}}}".to_vec()),
        Just(b"{\"type\":\"result\",\"stats\":[],\"status\":null}".to_vec()),
        Just(b"[TOOL_CALL: ] {".to_vec()),
    ];
    proptest::collection::vec(line, 0..40)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any bytes in any chunks: no panic, the parser ends, and lines it
    /// cannot read come back as events rather than disappearing silently.
    #[test]
    fn parsers_are_total(lines in hostile_lines(), cuts in proptest::collection::vec(0usize..64, 0..8), stderr in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut bytes = Vec::new();
        for l in &lines {
            bytes.extend_from_slice(l);
            bytes.push(b'\n');
        }
        for kind in ProviderKind::ALL {
            let mut p = Parser::new(kind, Some(source_fixtures_root())).with_line_limit(48);
            let mut rest = &bytes[..];
            let mut events = Vec::new();
            for c in &cuts {
                let (a, b) = rest.split_at((*c).min(rest.len()));
                events.extend(p.feed(a));
                events.extend(p.feed_stderr(&stderr));
                rest = b;
            }
            events.extend(p.feed(rest));
            events.extend(p.finish());
            let non_blank = lines.iter().filter(|l| !l.iter().all(u8::is_ascii_whitespace)).count();
            if non_blank > 0 {
                prop_assert!(!events.is_empty());
            }
            for e in &events {
                prop_assert!(serde_json::to_string(e).is_ok());
            }
        }
    }
}

/// The seed's OpenCode shape (`message`, `tool`, `tool_output`, `done`)
/// reads as the same agent events as the installed CLI's shape, with no
/// `unknown_event`; read by every strategy of the chain (the guard may move
/// on, since it differs from the newest recording).
#[test]
fn opencode_seed_kinds_parse_like_the_cli_shape() {
    let seed = fixture(ProviderKind::Opencode, "seed-000", "kinds.jsonl");
    for parser in [
        Parser::new(ProviderKind::Opencode, None),
        Parser::embedded(ProviderKind::Opencode),
    ] {
        let mut p = parser;
        let mut ev = p.feed(&seed);
        ev.extend(p.finish());
        let ev: Vec<AgentEvent> = ev
            .into_iter()
            .filter(|e| !matches!(e, AgentEvent::DriftDetected { .. }))
            .collect();
        assert_eq!(
            types(&ev),
            [
                "agent.message",
                "agent.tool_call",
                "agent.tool_result",
                "agent.tool_call",
                "agent.tool_result",
                "agent.message",
                "agent.usage",
                "agent.idle"
            ],
            "{ev:#?}"
        );
        assert_eq!(
            ev[1],
            AgentEvent::ToolCall {
                id: Some("call_1".into()),
                name: "bash".into(),
                input: serde_json::json!({"command": "ls"})
            }
        );
        assert_eq!(
            ev[2],
            AgentEvent::ToolResult {
                id: Some("call_1".into()),
                name: Some("bash".into()),
                output: "Cargo.toml\nsrc".into(),
                is_error: false
            }
        );
        assert!(
            matches!(&ev[4], AgentEvent::ToolResult { name: Some(n), is_error: true, output, .. } if n == "read" && output.contains("not found")),
            "{ev:#?}"
        );
        assert_eq!(
            ev[7],
            AgentEvent::Idle {
                status: "stop".into(),
                is_error: false,
                result: None
            }
        );
    }
}

#[test]
fn opencode_seed_kinds_also_read_under_kind_and_report_failures() {
    let lines = concat!(
        r#"{"kind":"message","text":"hi","delta":true}"#,
        "\n",
        r#"{"kind":"done","status":"error","error":{"message":"rate limited"}}"#,
        "\n"
    );
    let ev = parse_all(ProviderKind::Opencode, lines.as_bytes());
    let ev: Vec<&AgentEvent> = ev
        .iter()
        .filter(|e| !matches!(e, AgentEvent::DriftDetected { .. }))
        .collect();
    assert_eq!(
        *ev[0],
        AgentEvent::Message {
            text: "hi".into(),
            delta: true
        }
    );
    assert!(
        matches!(ev[1], AgentEvent::Error { kind: ErrorKind::Provider, message } if message == "rate limited")
    );
    assert!(matches!(ev[2], AgentEvent::Idle { is_error: true, .. }));
}

#[test]
fn probe_due_follows_the_last_output_and_the_stale_time() {
    let quiet = Duration::from_secs(2);
    let t0 = Instant::now();
    let mut p = Parser::new(ProviderKind::GeminiCli, None).with_stale_after(quiet);
    assert!(p.probes());
    p.feed_at(b"{\"type\":\"init\",\"session_id\":\"g\"}\n", t0);
    assert_eq!(p.probe_due(), Some(t0 + quiet));
    assert!(!p.needs_probe(t0 + quiet - Duration::from_millis(1)));
    assert!(p.needs_probe(t0 + quiet));
    p.probe_sent(t0 + quiet);
    assert_eq!(p.probe_due(), None, "one probe per silence");
    let t1 = t0 + quiet * 3;
    p.feed_at(
        b"{\"type\":\"message\",\"role\":\"assistant\",\"content\":\"x\"}\n",
        t1,
    );
    assert_eq!(p.probe_due(), Some(t1 + quiet), "output re-arms the probe");
    assert!(!Parser::new(ProviderKind::Codex, None).probes());
    assert_eq!(Parser::new(ProviderKind::Codex, None).probe_due(), None);
}

#[test]
fn a_codex_mcp_tool_calls_result_is_its_text_not_json() {
    let lines = concat!(
        r#"{"type":"item.started","item":{"id":"item_1","type":"mcp_tool_call","server":"everything","tool":"echo","arguments":{"message":"hi"},"status":"in_progress"}}"#,
        "\n",
        r#"{"type":"item.completed","item":{"id":"item_1","type":"mcp_tool_call","server":"everything","tool":"echo","arguments":{"message":"hi"},"result":{"content":[{"type":"text","text":"Echo: hi"}],"structured_content":null},"error":null,"status":"completed"}}"#,
        "\n"
    );
    let events = parse_all(ProviderKind::Codex, lines.as_bytes());
    let output = events.iter().find_map(|e| match e {
        AgentEvent::ToolResult {
            output, is_error, ..
        } => Some((output.clone(), *is_error)),
        _ => None,
    });
    assert_eq!(output, Some(("Echo: hi".to_string(), false)), "{events:?}");
}

#[test]
fn known_stderr_chatter_is_a_notice_and_the_rest_an_error() {
    let mut p = Parser::new(ProviderKind::GeminiCli, None);
    let events = p.feed_stderr(
        concat!(
            "YOLO mode is enabled. All tool calls will be automatically approved.\n",
            "\u{1b}[33mWarning: True color (24-bit) support not detected. Using a terminal with true color enabled will result in a better visual experience.\u{1b}[0m\n",
            "Reading additional input from stdin...\n",
            "Error: quota exceeded\n",
        )
        .as_bytes(),
    );
    assert_eq!(
        types(&events),
        [
            "agent.notice",
            "agent.notice",
            "agent.notice",
            "agent.error"
        ],
        "{events:?}"
    );
    assert!(
        matches!(&events[3], AgentEvent::Error { kind: ErrorKind::Stderr, message } if message == "Error: quota exceeded")
    );
}

/// Every provider's drift guard is armed: output in a format none of its
/// fixtures has (every key renamed) is drift, and the parser moves down the
/// chain instead of reading it as the native format.
#[test]
fn every_provider_notices_a_format_it_has_never_seen() {
    let alien: String = (0..DRIFT_WINDOW_LINES)
        .map(|i| format!("{{\"kind\":\"frame\",\"seq\":{i},\"payload\":{{\"body\":\"x\"}}}}\n"))
        .collect();
    for kind in ProviderKind::ALL {
        let ev = parse_all(kind, alien.as_bytes());
        let first = ev.iter().find_map(|e| match e {
            AgentEvent::DriftDetected { from, ratio, .. } => Some((*from, *ratio)),
            _ => None,
        });
        let (from, ratio) = first.unwrap_or_else(|| panic!("{kind:?}: no drift in {ev:#?}"));
        assert_eq!(from, detection_chain(kind)[0], "{kind:?}");
        assert!(ratio < DRIFT_THRESHOLD, "{kind:?}: {ratio}");
    }
}

/// The refusals each CLI reports in its own output are denials (before
/// the turn's end), whatever the turn's end claims; an ordinary tool
/// failure is none.
#[test]
fn every_cli_s_own_refusal_is_a_denial() {
    let denials = |events: &[AgentEvent]| -> Vec<(String, String)> {
        events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::Denied { tool, rule, .. } => Some((tool.clone(), rule.clone())),
                _ => None,
            })
            .collect()
    };
    let pair = |t: &str, r: &str| vec![(t.to_string(), r.to_string())];
    // Claude Code: a success `result` listing a refused call.
    let claude = br#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"rm -rf /"}}]}}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"Claude requested permissions to use Bash, but you haven't granted it yet.","is_error":true}]}}
{"type":"result","subtype":"success","is_error":false,"result":"All done, everything worked!","permission_denials":[{"tool_name":"Bash","tool_use_id":"t1","tool_input":{"command":"rm -rf /"}}]}
"#;
    let ev = parse_all(ProviderKind::ClaudeCode, claude);
    assert_eq!(denials(&ev), pair("Bash", "permission_denials"));
    let at = |t: &str| ev.iter().position(|e| e.type_name() == t).unwrap();
    assert!(at("tool.denied") < at("agent.idle"));
    // A flood of listed denials is cut at the bound.
    let many: Vec<String> = (0..1000)
        .map(|i| format!(r#"{{"tool_name":"T{i}","tool_use_id":"x{i}"}}"#))
        .collect();
    let flood = format!(
        "{{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"permission_denials\":[{}]}}\n",
        many.join(",")
    );
    let ev = parse_all(ProviderKind::ClaudeCode, flood.as_bytes());
    assert_eq!(denials(&ev).len(), native::MAX_DENIALS_PER_LINE);
    // Gemini CLI: a call its policy engine refused; a failed call is none.
    let gemini = br#"{"type":"tool_use","tool_name":"run_shell_command","tool_id":"g1","parameters":{}}
{"type":"tool_result","tool_id":"g1","status":"error","error":{"type":"policy_violation","message":"Tool execution denied by policy."}}
{"type":"tool_use","tool_name":"read_file","tool_id":"g2","parameters":{}}
{"type":"tool_result","tool_id":"g2","status":"error","error":{"type":"file_not_found","message":"no such file"}}
{"type":"result","status":"success","stats":{}}
"#;
    let ev = parse_all(ProviderKind::GeminiCli, gemini);
    assert_eq!(denials(&ev), pair("run_shell_command", "policy_violation"));
    // Codex: a declined command; a failed one is none.
    let codex = br#"{"type":"item.completed","item":{"id":"c1","type":"command_execution","command":"rm x","aggregated_output":"","status":"declined"}}
{"type":"item.completed","item":{"id":"c2","type":"command_execution","command":"false","aggregated_output":"","exit_code":1,"status":"failed"}}
{"type":"turn.completed","usage":{}}
"#;
    let ev = parse_all(ProviderKind::Codex, codex);
    assert_eq!(denials(&ev), pair("command_execution", "declined"));
    // OpenCode: a call a `deny` rule refused; another error is none.
    let opencode = br#"{"type":"tool_use","part":{"callID":"o1","tool":"bash","state":{"status":"error","input":{},"error":"The user has specified a rule which prevents you from using this specific tool call. Here are some of the relevant rules []"}}}
{"type":"tool_use","part":{"callID":"o2","tool":"read","state":{"status":"error","input":{},"error":"File not found"}}}
{"type":"step_finish","part":{"reason":"stop"}}
"#;
    let ev = parse_all(ProviderKind::Opencode, opencode);
    assert_eq!(denials(&ev), pair("bash", "permission"));
}
