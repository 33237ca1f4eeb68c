//! Provider launch plans against the real agent CLIs (when installed:
//! `--version` and the help of the subcommand npc uses must accept every
//! flag the plan passes), and the fake agent (`fixtures/clis/fake-agent.py`)
//! replaying fixtures through the parsers as a real child process.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use npcagent::model::{Provider, ProviderKind, Text};
use npcagent::providers::{AgentEvent, LaunchRequest, Parser, launch_plan, source_fixtures_root};

use crate::support::repo_root;

/// Read size when streaming a child's stdout into a parser.
const READ_CHUNK: usize = 4096;

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

fn provider(kind: ProviderKind, command: &str, args: &[&str]) -> Provider {
    Provider {
        kind,
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
    let mut checked = 0;
    for kind in ProviderKind::ALL {
        let program = kind.default_command();
        let Some(path) = on_path(program) else {
            println!(
                "note: `{program}` is not on PATH; skipped (install with `npm install -g @anthropic-ai/claude-code @openai/codex @google/gemini-cli opencode-ai`)"
            );
            continue;
        };
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
            mcp_config: (kind != ProviderKind::Codex).then_some(mcp),
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
        mcp_config: None,
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
