//! `driver = "acp"` against a hostile ACP agent (`fixtures/acp/hostile-agent.py`)
//! through the real binary: garbage, a frame over the bound, a method npc
//! did not offer, a question and an update of another session, a flood of
//! updates; an agent that dies mid-turn; an agent of another protocol
//! version. The run stays bounded and says what happened; nothing the
//! agent sends becomes a decision. (The four real agents are in
//! `real_clis`.)

use std::path::Path;

use serde_json::Value;

use crate::support::{npc, repo_root};

/// Message chunks the flooding agent sends.
const FLOOD: usize = 20_000;

fn repo(mode: &str, log: &Path) -> tempfile::TempDir {
    repo_with(mode, log, "")
}

/// [`repo`] with `more` appended to the manifest.
fn repo_with(mode: &str, log: &Path, more: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let agent = repo_root().join("fixtures/acp/hostile-agent.py");
    std::fs::write(
        dir.path().join("npcagent.toml"),
        format!(
            "version = 1\n[providers.hostile]\nkind = \"gemini_cli\"\ndriver = \"acp\"\ncommand = \"python3\"\nargs = [{agent:?}]\nenv = {{ HOSTILE_AGENT_MODE = \"{mode}\", HOSTILE_AGENT_LOG = {log:?}, HOSTILE_AGENT_FLOOD = \"{FLOOD}\" }}\n[profiles.p]\nprovider = \"hostile\"\ndescription = \"a hostile agent\"\n{more}"
        ),
    )
    .unwrap();
    dir
}

fn run(dir: &Path) -> (Option<i32>, Vec<Value>, String) {
    let out = npc()
        .current_dir(dir)
        .args([
            "run",
            "p",
            "--prompt",
            "go",
            "--format",
            "json",
            "--timeout",
            "120",
        ])
        .output()
        .unwrap();
    let events = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (
        out.status.code(),
        events,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_flooding_hostile_agent_is_answered_with_errors_and_stays_bounded() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("answers.jsonl");
    let dir = repo("flood", &log);
    let (code, events, stderr) = run(dir.path());
    assert_eq!(code, Some(0), "{stderr}");
    // Every chunk of its own session is a message; the forged one is not.
    let messages = events
        .iter()
        .filter(|e| e["type"] == "agent.message")
        .count();
    assert_eq!(messages, FLOOD);
    assert!(!events.iter().any(|e| e["text"] == "forged words"));
    // Complaints are bounded, and name what happened.
    let errors: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "agent.error")
        .collect();
    assert!(
        errors.len() <= npcagent::providers::acp::MAX_COMPLAINTS,
        "{errors:#?}"
    );
    let said = |what: &str| {
        errors
            .iter()
            .any(|e| e["message"].as_str().unwrap_or("").contains(what))
    };
    assert!(said("not JSON-RPC"), "{errors:#?}");
    assert!(said("longer than"), "{errors:#?}");
    assert!(said("fs/read_text_file"), "{errors:#?}");
    // What npc answered: "method not found" for `fs`, `cancelled` for the
    // other session's question (nobody decided it).
    let answers: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let fs = answers
        .iter()
        .find(|a| a["id"] == 100)
        .expect("an answer to fs/read_text_file");
    assert_eq!(fs["error"]["code"], -32601, "{fs}");
    let permission = answers
        .iter()
        .find(|a| a["id"] == 101)
        .expect("an answer to the question");
    assert_eq!(
        permission["result"]["outcome"]["outcome"], "cancelled",
        "{permission}"
    );
    let idle = events.iter().find(|e| e["type"] == "agent.idle").unwrap();
    assert_eq!(idle["status"], "end_turn");
}

#[test]
fn an_agent_that_dies_mid_turn_fails_the_run_and_says_so() {
    let work = tempfile::tempdir().unwrap();
    let dir = repo("exit", &work.path().join("log"));
    let (code, _, stderr) = run(dir.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("before its turn ended"), "{stderr}");
}

#[test]
fn an_agent_of_another_protocol_version_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let dir = repo("version", &work.path().join("log"));
    let (code, _, stderr) = run(dir.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("protocol version 1"), "{stderr}");
}

/// A `before_tool` hook that rewrites the call's arguments cannot be
/// carried by an ACP permission answer: the call is denied with the
/// agent's reject option, the denial is recorded, and the run ends
/// `blocked` (exit 3), not `succeeded` with the call refused unseen.
#[test]
fn a_rewritten_call_is_denied_recorded_and_blocks_the_run() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("answers.jsonl");
    let hook = "[[hooks.before_tool]]\ncommand = \"sh\"\nargs = [\"-c\", \"echo '{\\\"decision\\\":\\\"rewrite\\\",\\\"arguments\\\":{\\\"command\\\":\\\"false\\\"}}'\"]\n";
    let dir = repo_with("ask", &log, hook);
    let (code, _, stderr) = run(dir.path());
    assert_eq!(code, Some(3), "{stderr}");
    let answer: Value = serde_json::from_str(
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(answer["result"]["outcome"]["optionId"], "no", "{answer}");
    assert!(
        stderr.contains("`Bash` denied by hook (acp_permission)"),
        "{stderr}"
    );
}
