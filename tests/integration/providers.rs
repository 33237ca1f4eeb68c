//! Provider launch plans against the real agent CLIs (when installed:
//! `--version` and the help of the subcommand npc uses must accept every
//! flag the plan passes), and the fake agent (`fixtures/clis/fake-agent.py`)
//! replaying fixtures through the parsers as a real child process; and the
//! difflib port compared bit for bit with python3's own difflib.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use npcagent::model::{Provider, ProviderKind, Text};
use npcagent::providers::similarity::{AUTOJUNK_MIN_LEN, SequenceMatcher};
use npcagent::providers::{
    AgentEvent, ErrorKind, LaunchRequest, McpHandoff, Parser, RunMcp, launch_plan,
    source_fixtures_root,
};

use crate::support::{Peer, on_path, repo_root, require};

/// Read size when streaming a child's stdout into a parser.
const READ_CHUNK: usize = 4096;

fn provider(kind: ProviderKind, command: &str, args: &[&str]) -> Provider {
    Provider {
        kind,
        driver: npcagent::model::ProviderDriver::Headless,
        command: command.to_string(),
        args: args.iter().map(|a| Text::plain(*a)).collect(),
        env: BTreeMap::new(),
        version: None,
    }
}

/// The help text that documents the flags of the plan npc builds.
fn help_args(kind: ProviderKind) -> &'static [&'static str] {
    match kind {
        ProviderKind::ClaudeCode => &["--help"],
        ProviderKind::Codex => &["exec", "--help"],
        ProviderKind::GeminiCli => &["--help"],
        ProviderKind::Opencode => &["run", "--help"],
    }
}

#[test]
fn installed_clis_accept_the_flags_of_the_launch_plans() {
    let mcp = Path::new("/tmp/npc-mcp.json");
    let pairs = vec![r#"mcp_servers.npc={ command = "npc" }"#.to_string()];
    let names = vec!["npc".to_string()];
    let mut checked = 0;
    for kind in ProviderKind::ALL {
        let program = kind.default_command();
        if !require(Peer::program(
            program,
            "npm install -g @anthropic-ai/claude-code @openai/codex @google/gemini-cli opencode-ai",
        )) {
            continue;
        }
        let path = on_path(program).expect("required above");
        let version = Command::new(&path)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .expect("runs --version");
        assert!(version.status.success(), "{program} --version failed");
        let version_text = String::from_utf8_lossy(&version.stdout);
        assert!(
            version_text.chars().any(|c| c.is_ascii_digit()),
            "{program} --version printed no version: {version_text}"
        );
        let help = Command::new(&path)
            .args(help_args(kind))
            .stdin(Stdio::null())
            .output()
            .expect("runs help");
        let help_text = format!(
            "{}{}",
            String::from_utf8_lossy(&help.stdout),
            String::from_utf8_lossy(&help.stderr)
        );
        let req = LaunchRequest {
            prompt: "say hi",
            model: Some("some-model"),
            mcp: Some(match npcagent::providers::mcp_handoff(kind) {
                McpHandoff::File => RunMcp::File { path: mcp },
                McpHandoff::Overrides => RunMcp::Overrides { pairs: &pairs },
                McpHandoff::WorkspaceSettings => RunMcp::Named { names: &names },
            }),
        };
        let plan = launch_plan(&provider(kind, program, &[]), &req).expect("plan");
        let flags: Vec<&str> = plan.exposed_args().filter(|a| a.starts_with('-')).collect();
        assert!(!flags.is_empty());
        for flag in flags {
            assert!(
                help_text.contains(flag),
                "`{program}` help does not mention `{flag}` (version {version_text})"
            );
        }
        for value in ["stream-json", "json"] {
            if plan.exposed_args().any(|a| a == value) {
                assert!(
                    help_text.contains(value),
                    "`{program}` help lacks `{value}`"
                );
            }
        }
        checked += 1;
    }
    println!("checked {checked} installed agent CLIs");
}

fn fake_agent() -> PathBuf {
    repo_root().join("fixtures/clis/fake-agent.py")
}

/// Launch the fake agent as `kind` replaying `fixture`, stream its stdout
/// through a parser in small reads, and return the events and exit code.
fn run_fake(
    kind: ProviderKind,
    fixture: &Path,
    env: &[(&str, &str)],
) -> (Vec<AgentEvent>, Option<i32>) {
    let fixture_arg = fixture.to_string_lossy().into_owned();
    let p = provider(
        kind,
        &fake_agent().to_string_lossy(),
        &["--provider", kind.as_str(), "--fixture", &fixture_arg],
    );
    let req = LaunchRequest {
        prompt: "replay",
        model: Some("m"),
        mcp: None,
    };
    let plan = launch_plan(&p, &req).expect("plan");
    let mut child = Command::new(&plan.program)
        .args(plan.exposed_args())
        .envs(plan.exposed_env())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs the fake agent");
    let mut parser = Parser::new(kind, Some(source_fixtures_root()));
    let mut events = Vec::new();
    let mut stdout = child.stdout.take().expect("stdout");
    let mut buf = [0u8; READ_CHUNK];
    loop {
        let n = stdout.read(&mut buf).expect("read stdout");
        if n == 0 {
            break;
        }
        events.extend(parser.feed(&buf[..n]));
    }
    let mut err = Vec::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_end(&mut err)
        .expect("read stderr");
    events.extend(parser.feed_stderr(&err));
    events.extend(parser.finish());
    let status = child.wait().expect("wait");
    (events, status.code())
}

#[test]
fn fake_agent_replays_every_provider_through_its_parser() {
    for (kind, version) in [
        (ProviderKind::ClaudeCode, "2.1.197"),
        (ProviderKind::Codex, "0.171.0"),
        (ProviderKind::GeminiCli, "0.61.0"),
        (ProviderKind::Opencode, "1.18.33"),
    ] {
        let fixture = source_fixtures_root()
            .join(kind.as_str())
            .join(version)
            .join("tool_call.jsonl");
        let (events, code) = run_fake(kind, &fixture, &[]);
        assert_eq!(code, Some(0));
        let names: Vec<_> = events.iter().map(AgentEvent::type_name).collect();
        for want in ["agent.tool_call", "agent.tool_result", "agent.idle"] {
            assert!(names.contains(&want), "{kind:?}: {names:?}");
        }
        assert!(!names.contains(&"agent.error"), "{kind:?}: {events:#?}");
    }
}

/// The real streams recorded through the scripted model
/// (`fixtures/model/record.py`) parse into a turn with no unknown line and
/// no error: a tool call, its result and the final text, or the text alone.
#[test]
fn recorded_real_streams_parse_without_unknown_events() {
    let mut checked = 0;
    for kind in ProviderKind::ALL {
        let dir = source_fixtures_root().join(kind.as_str());
        for version in std::fs::read_dir(&dir).unwrap() {
            for scenario in ["tool-call", "text"] {
                let path = version
                    .as_ref()
                    .unwrap()
                    .path()
                    .join(format!("recorded-{scenario}.jsonl"));
                let Ok(text) = std::fs::read(&path) else {
                    continue;
                };
                let mut parser = Parser::embedded(kind);
                let mut events = parser.feed(&text);
                events.extend(parser.finish());
                let names: Vec<_> = events.iter().map(AgentEvent::type_name).collect();
                let mut want = vec!["agent.message", "agent.idle"];
                if scenario == "tool-call" {
                    want.push("agent.tool_call");
                    want.push("agent.tool_result");
                }
                for name in want {
                    assert!(
                        names.contains(&name),
                        "{}: no {name} in {names:?}",
                        path.display()
                    );
                }
                let unknown = events.iter().filter(|e| {
                    matches!(
                        e,
                        AgentEvent::Error {
                            kind: ErrorKind::UnknownEvent,
                            ..
                        }
                    )
                });
                assert_eq!(unknown.count(), 0, "{}: {events:#?}", path.display());
                checked += 1;
            }
        }
    }
    assert!(checked >= 8, "only {checked} recorded streams");
}

#[test]
fn fake_agent_records_argv_exit_code_and_stderr() {
    let dir = tempfile::tempdir().expect("tempdir");
    let argv_file = dir.path().join("argv.json");
    let fixture = source_fixtures_root().join("codex/0.171.0/idle.jsonl");
    let (events, code) = run_fake(
        ProviderKind::Codex,
        &fixture,
        &[
            (
                "FAKE_AGENT_ARGV_FILE",
                argv_file.to_str().expect("utf-8 path"),
            ),
            ("FAKE_AGENT_EXIT", "3"),
            ("FAKE_AGENT_STDERR", "warning: offline"),
        ],
    );
    assert_eq!(code, Some(3));
    let argv: Vec<String> =
        serde_json::from_slice(&std::fs::read(&argv_file).expect("argv file")).expect("json");
    assert_eq!(argv[..2], ["exec", "--json"]);
    assert_eq!(argv[argv.len() - 3..], ["--model", "m", "replay"]);
    assert!(events.iter().any(|e| matches!(
        e,
        AgentEvent::Error { message, .. } if message == "warning: offline"
    )));
}

#[test]
fn a_hanging_fake_agent_delivers_its_events_before_it_is_killed() {
    let fixture = source_fixtures_root().join("gemini_cli/0.61.0/idle.jsonl");
    let mut child = Command::new(fake_agent())
        .args(["--provider", "gemini_cli", "--fixture"])
        .arg(&fixture)
        .env("FAKE_AGENT_HANG", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fake agent");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut parser = Parser::new(ProviderKind::GeminiCli, Some(source_fixtures_root()));
    let mut buf = [0u8; READ_CHUNK];
    // Reading blocks until the idle line arrives; the child keeps running.
    let mut idle = false;
    while !idle {
        let n = stdout.read(&mut buf).expect("read");
        assert!(n > 0, "fake agent closed stdout instead of hanging");
        idle = parser
            .feed(&buf[..n])
            .iter()
            .any(|e| matches!(e, AgentEvent::Idle { .. }));
    }
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "still running"
    );
    child.kill().expect("kill");
    let status = child.wait().expect("wait");
    assert!(!status.success());
}

// --- difflib: the port in `providers::similarity` against python3 itself ---

/// Deterministic xorshift, so a failing case can be reproduced.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One generated input: two strings (compared by character) or two token
/// lists, and the autojunk flag.
struct Case {
    a: Vec<String>,
    b: Vec<String>,
    chars: bool,
    autojunk: bool,
}

fn generate(rng: &mut Rng) -> Case {
    const ALPHABETS: [&[&str]; 4] = [
        &["a", "b"],
        &["a", "b", "c", "d", "e"],
        &["x", "y", "é", "→", "z", "|", ",", "."],
        &[
            "init",
            "message",
            "tool_use",
            "tool_result",
            "result",
            "error",
        ],
    ];
    let alphabet = ALPHABETS[rng.below(ALPHABETS.len())];
    // lengths on both sides of the autojunk threshold
    let max_len = [12, 60, 260, 450][rng.below(4)];
    let len_a = rng.below(max_len + 1);
    let a: Vec<String> = (0..len_a)
        .map(|_| alphabet[rng.below(alphabet.len())].to_string())
        .collect();
    // b is often an edited copy of a, so long matches occur
    let b: Vec<String> = if rng.below(2) == 0 {
        let mut b = a.clone();
        for _ in 0..rng.below(len_a / 4 + 2) {
            let at = rng.below(b.len() + 1);
            match rng.below(3) {
                0 if at < b.len() => {
                    b.remove(at);
                }
                1 => b.insert(at, alphabet[rng.below(alphabet.len())].to_string()),
                _ if at < b.len() => b[at] = alphabet[rng.below(alphabet.len())].to_string(),
                _ => {}
            }
        }
        b
    } else {
        let len_b = rng.below(max_len + 1);
        (0..len_b)
            .map(|_| alphabet[rng.below(alphabet.len())].to_string())
            .collect()
    };
    Case {
        a,
        b,
        chars: alphabet.iter().all(|s| s.chars().count() == 1),
        autojunk: rng.below(4) != 0,
    }
}

const PYTHON: &str = r#"
import difflib, json, struct, sys
out = []
for case in json.load(sys.stdin):
    a, b = case["a"], case["b"]
    if case["chars"]:
        a, b = "".join(a), "".join(b)
    m = difflib.SequenceMatcher(None, a, b, autojunk=case["autojunk"])
    blocks = [list(x) for x in m.get_matching_blocks()]
    bits = struct.unpack("<Q", struct.pack("<d", m.ratio()))[0]
    out.append({"blocks": blocks, "bits": str(bits)})
json.dump(out, sys.stdout)
"#;

/// Python's difflib and this port agree exactly — matching blocks and the
/// bits of the ratio — on generated inputs of every kind: short and long
/// (autojunk on and off), strings with multi-byte characters, token lists.
#[test]
fn agrees_bit_for_bit_with_python_difflib_on_generated_inputs() {
    const CASES: usize = 1500;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let cases: Vec<Case> = (0..CASES).map(|_| generate(&mut rng)).collect();
    let input: Vec<serde_json::Value> = cases
        .iter()
        .map(|c| serde_json::json!({"a": c.a, "b": c.b, "chars": c.chars, "autojunk": c.autojunk}))
        .collect();
    let mut child = std::process::Command::new("python3")
        .args(["-c", PYTHON])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (the difflib comparison needs it)");
    let body = serde_json::to_vec(&input).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &body));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "python3 failed");
    let answers: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answers.len(), CASES);
    let mut long_autojunk = 0;
    for (i, (case, want)) in cases.iter().zip(&answers).enumerate() {
        let (blocks, ratio) = if case.chars {
            let a: Vec<char> = case.a.concat().chars().collect();
            let b: Vec<char> = case.b.concat().chars().collect();
            let m = SequenceMatcher::with_autojunk(&a, &b, case.autojunk);
            (m.matching_blocks(), m.ratio())
        } else {
            let m = SequenceMatcher::with_autojunk(&case.a, &case.b, case.autojunk);
            (m.matching_blocks(), m.ratio())
        };
        let blocks: Vec<[usize; 3]> = blocks.iter().map(|m| [m.a, m.b, m.size]).collect();
        let want_blocks: Vec<[usize; 3]> = serde_json::from_value(want["blocks"].clone()).unwrap();
        assert_eq!(
            blocks, want_blocks,
            "case {i}: {:?} vs {:?}",
            case.a, case.b
        );
        let want_bits: u64 = want["bits"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            ratio.to_bits(),
            want_bits,
            "case {i}: {ratio} vs {}",
            f64::from_bits(want_bits)
        );
        long_autojunk += usize::from(case.autojunk && case.b.len() >= AUTOJUNK_MIN_LEN);
    }
    assert!(
        long_autojunk > 150,
        "only {long_autojunk} cases exercised autojunk"
    );
}
