//! `npc run`: the real binary running a profile whose provider is the fake
//! agent (`fixtures/clis/fake-agent.py`), which replays recorded CLI output.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use crate::support::{Daemon, alive, npc, npc_path, repo_root, wait_for};

/// A temporary repository whose profile `dev` runs the fake agent as
/// `kind`, replaying `fixture`, with `env` in the provider's environment.
fn repo(kind: &str, fixture: &str, env: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = repo_without_servers(kind, fixture, env);
    let path = dir.path().join("npcagent.toml");
    let manifest = std::fs::read_to_string(&path).unwrap();
    let manifest = format!(
        "{}\n[mcp.servers.fs]\ncommand = \"npx\"\nargs = [\"-y\", \"@modelcontextprotocol/server-filesystem\", \".\"]\n",
        manifest.replace(
            "prompt = \"task\"\n",
            "prompt = \"task\"\nmcp_servers = [\"fs\"]\n"
        )
    );
    std::fs::write(path, manifest).unwrap();
    dir
}

/// [`repo`] without the profile's MCP server: a daemon on it starts nothing
/// but what a run starts.
fn repo_without_servers(kind: &str, fixture: &str, env: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let fixture = repo_root().join("fixtures/clis").join(fixture);
    let env: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k} = {}", toml_str(v)))
        .collect();
    let manifest = format!(
        r#"
version = 1

[providers.fake]
kind = "{kind}"
command = {agent}
args = ["--provider", "{kind}", "--fixture", {fixture}]
env = {{ {env} }}

[prompts.task]
template = "Fix {{{{ vars.what }}}} now"
variables.what = {{ default = "everything" }}

[profiles.dev]
provider = "fake"
description = "development"
prompt = "task"
"#,
        agent = toml_str(&agent.display().to_string()),
        fixture = toml_str(&fixture.display().to_string()),
        env = env.join(", "),
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

fn toml_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

fn events(dir: &Path) -> Vec<Value> {
    let out = npc()
        .current_dir(dir)
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn finished(dir: &Path) -> Value {
    events(dir)
        .into_iter()
        .find(|e| e["kind"] == "run.finished")
        .expect("a run.finished event")
}

fn read_pid(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Ctrl-C to `npc run`: it exits 130 and its agent is gone.
fn interrupt(run: &mut std::process::Child, agent: i32) {
    kill(Pid::from_raw(run.id() as i32), Signal::SIGINT).unwrap();
    let status = wait_for("npc run to exit", || run.try_wait().unwrap());
    assert_eq!(status.code(), Some(130));
    wait_for("the cancelled agent to be gone", || {
        (!alive(agent as u32)).then_some(())
    });
}

/// A repository made by `make` whose Claude Code agent hangs after writing
/// its pid to `pid_file`.
fn hanging(
    make: fn(&str, &str, &[(&str, &str)]) -> tempfile::TempDir,
    pid_file: &Path,
) -> tempfile::TempDir {
    make(
        "claude_code",
        CLAUDE_TOOL_CALL,
        &[
            ("FAKE_AGENT_HANG", "1"),
            ("FAKE_AGENT_PID_FILE", pid_file.to_str().unwrap()),
        ],
    )
}

/// `npc run dev --prompt PROMPT` in `dir`, in the background, once its
/// (hanging) agent wrote its pid to `pid_file`: the command and the agent's pid.
fn start_hanging_run(dir: &Path, prompt: &str, pid_file: &Path) -> (std::process::Child, i32) {
    let _ = std::fs::remove_file(pid_file);
    let child = std::process::Command::new(npc_path())
        .current_dir(dir)
        .args(["run", "dev", "--prompt", prompt])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = wait_for("the agent's pid", || read_pid(pid_file));
    (child, pid)
}

const CLAUDE_TOOL_CALL: &str = "claude_code/2.1.197/tool_call.jsonl";

#[test]
fn a_claude_run_streams_messages_and_records_them_with_its_run_id() {
    let dir = repo("claude_code", CLAUDE_TOOL_CALL, &[]);
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "list the files"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("Listing files."), "{stdout}");
    assert!(stdout.contains("→ Bash {\"command\":\"ls\"}"), "{stdout}");
    assert!(stdout.contains("✓ done (success)"), "{stdout}");

    let all = events(dir.path());
    let started = all.iter().find(|e| e["kind"] == "run.started").unwrap();
    let run_id = started["payload"]["run_id"].as_str().unwrap().to_string();
    assert!(run_id.starts_with("run-"));
    let root = dir.path().canonicalize().unwrap();
    assert_eq!(started["payload"]["cwd"], root.display().to_string());
    assert_eq!(started["payload"]["tool_cwd"], root.display().to_string());
    let agent: Vec<&Value> = all
        .iter()
        .filter(|e| e["kind"].as_str().unwrap().starts_with("agent."))
        .collect();
    for kind in [
        "agent.message",
        "agent.tool_call",
        "agent.tool_result",
        "agent.idle",
        "agent.usage",
    ] {
        assert!(
            agent.iter().any(|e| e["kind"] == kind),
            "no {kind} in {agent:?}"
        );
    }
    for e in &agent {
        assert_eq!(e["payload"]["run_id"], run_id.as_str());
        assert_eq!(e["component"], format!("run.{run_id}"));
    }
    let fin = finished(dir.path());
    assert_eq!(fin["payload"]["outcome"], "succeeded");
    assert_eq!(fin["payload"]["exit"]["code"], 0);
    assert_eq!(fin["payload"]["cancelled"], false);
    // The profile's MCP server went to the run's own Claude config file.
    let config = PathBuf::from(started["payload"]["mcp_config"].as_str().unwrap());
    assert!(config.starts_with(root.join(".npc/runs").join(&run_id)));
    let parsed: Value = serde_json::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    assert_eq!(parsed["mcpServers"]["fs"]["command"], "npx");
}

#[test]
fn json_format_prints_one_agent_event_per_line() {
    let dir = repo("claude_code", CLAUDE_TOOL_CALL, &[]);
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "go", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every stdout line is JSON"))
        .collect();
    assert!(lines.len() >= 5, "{lines:?}");
    let run_id = lines[0]["run_id"].as_str().unwrap();
    assert!(lines.iter().all(|l| l["run_id"] == run_id));
    let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert!(types.contains(&"agent.tool_call"), "{types:?}");
    assert_eq!(types.last(), Some(&"agent.idle"));
}

#[test]
fn the_agent_is_launched_with_the_rendered_prompt_and_stream_json() {
    let argv_dir = tempfile::tempdir().unwrap();
    let argv_file = argv_dir.path().join("argv.json");
    let dir = repo(
        "claude_code",
        CLAUDE_TOOL_CALL,
        &[("FAKE_AGENT_ARGV_FILE", argv_file.to_str().unwrap())],
    );
    let worktree = tempfile::tempdir().unwrap();
    npc()
        .current_dir(dir.path())
        .args([
            "run",
            "dev",
            "--prompt-template",
            "task",
            "--var",
            "what=the tests",
        ])
        .arg("--cwd")
        .arg(worktree.path())
        .assert()
        .code(0);
    let argv: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(&argv_file).unwrap()).unwrap();
    let at = |flag: &str| {
        argv.iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("no {flag} in {argv:?}"))
    };
    assert_eq!(argv[at("-p") + 1], "Fix the tests now");
    assert_eq!(argv[at("--output-format") + 1], "stream-json");
    assert!(argv[at("--mcp-config") + 1].ends_with(".mcp.json"));
    let started = events(dir.path())
        .into_iter()
        .find(|e| e["kind"] == "run.started")
        .unwrap();
    let wt = worktree.path().canonicalize().unwrap();
    assert_eq!(started["payload"]["cwd"], wt.display().to_string());
    assert_eq!(
        started["payload"]["tool_cwd"],
        dir.path().canonicalize().unwrap().display().to_string()
    );
}

#[test]
fn a_profile_prompt_is_rendered_when_no_prompt_is_given() {
    let argv_dir = tempfile::tempdir().unwrap();
    let argv_file = argv_dir.path().join("argv.json");
    let dir = repo(
        "claude_code",
        CLAUDE_TOOL_CALL,
        &[("FAKE_AGENT_ARGV_FILE", argv_file.to_str().unwrap())],
    );
    npc()
        .current_dir(dir.path())
        .args(["run", "dev"])
        .assert()
        .code(0);
    let argv: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(&argv_file).unwrap()).unwrap();
    assert!(argv.contains(&"Fix everything now".to_string()), "{argv:?}");
}

#[test]
fn a_non_zero_agent_exit_fails_the_run() {
    let dir = repo("claude_code", CLAUDE_TOOL_CALL, &[("FAKE_AGENT_EXIT", "3")]);
    npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "go"])
        .assert()
        .code(1);
    let fin = finished(dir.path());
    assert_eq!(fin["payload"]["outcome"], "failed");
    assert_eq!(fin["payload"]["exit"]["code"], 3);
}

#[test]
fn usage_errors_exit_2() {
    let dir = repo("claude_code", CLAUDE_TOOL_CALL, &[]);
    npc()
        .current_dir(dir.path())
        .args(["run", "nope", "--prompt", "go"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("no profile `nope`"));
    npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "go", "--var", "a=b"])
        .assert()
        .code(2);
}

#[test]
fn a_timed_out_run_kills_the_agent_and_exits_124() {
    let tmp = tempfile::tempdir().unwrap();
    let pid_file = tmp.path().join("pid");
    let dir = hanging(repo, &pid_file);
    npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "go", "--timeout", "1"])
        .assert()
        .code(124);
    let pid = read_pid(&pid_file).expect("the agent wrote its pid");
    wait_for("the timed-out agent to be gone", || {
        (!alive(pid as u32)).then_some(())
    });
    let fin = finished(dir.path());
    assert_eq!(fin["payload"]["outcome"], "timed_out");
    assert_eq!(fin["payload"]["exit_code"], 124);
}

#[test]
fn ctrl_c_cancels_the_run_kills_the_agent_and_exits_130() {
    let tmp = tempfile::tempdir().unwrap();
    let pid_file = tmp.path().join("pid");
    let dir = hanging(repo, &pid_file);
    let (mut child, pid) = start_hanging_run(dir.path(), "go", &pid_file);
    interrupt(&mut child, pid);
    let fin = finished(dir.path());
    assert_eq!(fin["payload"]["outcome"], "cancelled");
    assert_eq!(fin["payload"]["cancelled"], true);
}

#[test]
fn a_codex_run_gets_its_servers_as_config_overrides_and_reads_codex_json() {
    let argv_dir = tempfile::tempdir().unwrap();
    let argv_file = argv_dir.path().join("argv.json");
    let dir = repo(
        "codex",
        "codex/0.171.0/tool_call.jsonl",
        &[("FAKE_AGENT_ARGV_FILE", argv_file.to_str().unwrap())],
    );
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "go", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let types: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(types.iter().any(|t| t == "agent.tool_call"), "{types:?}");
    let argv: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(&argv_file).unwrap()).unwrap();
    assert_eq!(&argv[..2], ["exec", "--json"]);
    assert_eq!(argv.last().map(String::as_str), Some("go"));
    // The profile's server as a `-c` override: Codex has no MCP file flag.
    let at = argv.iter().position(|a| a == "-c").expect("a -c override");
    assert!(argv[at + 1].starts_with("mcp_servers.fs={ "), "{argv:?}");
}

/// The run rows `npc runs --format json` lists.
fn run_rows(dir: &Path) -> Vec<Value> {
    let out = npc()
        .current_dir(dir)
        .args(["runs", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

fn row_of(dir: &Path, id: &str) -> Option<Value> {
    run_rows(dir).into_iter().find(|r| r["id"] == id)
}

/// `npc runs show ID --format json`'s `run`: the stored row.
fn stored_row(dir: &Path, id: &str) -> Value {
    let out = npc()
        .current_dir(dir)
        .args(["runs", "show", id, "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["run"].clone()
}

fn started_run_id(dir: &Path) -> String {
    events(dir)
        .into_iter()
        .find(|e| e["kind"] == "run.started")
        .and_then(|e| e["payload"]["run_id"].as_str().map(str::to_string))
        .expect("a run.started event")
}

#[test]
fn npc_runs_lists_the_run_npc_run_carried_out_itself() {
    let dir = repo("claude_code", CLAUDE_TOOL_CALL, &[]);
    npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "list the files"])
        .assert()
        .success();
    let id = started_run_id(dir.path());
    let row = row_of(dir.path(), &id).expect("npc run's run is a row of the run queue");
    assert_eq!(row["origin"], "cli");
    assert_eq!(row["trigger"], "@manual");
    assert_eq!(row["state"], "succeeded");
    assert_eq!(row["profile"], "dev");
    // Carried out by the `npc run` process itself, which is gone now.
    let owner = stored_row(dir.path(), &id)["owner"]
        .as_str()
        .unwrap()
        .to_string();
    let pid: u32 = owner.split(':').next().unwrap().parse().unwrap();
    assert!(!alive(pid), "{owner}");
}

#[test]
fn with_a_daemon_up_npc_run_is_the_daemons_run_and_the_command_follows_it() {
    let dir = repo_without_servers("claude_code", CLAUDE_TOOL_CALL, &[]);
    let daemon = Daemon::start_in(dir.path());
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "list the files"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("Listing files."), "{stdout}");
    assert!(stdout.contains("→ Bash {\"command\":\"ls\"}"), "{stdout}");
    assert!(stderr.contains("(daemon)"), "{stderr}");
    assert!(stderr.contains("succeeded"), "{stderr}");
    let id = started_run_id(dir.path());
    let row = row_of(dir.path(), &id).unwrap();
    assert_eq!(
        (row["origin"].as_str(), row["state"].as_str()),
        (Some("cli"), Some("succeeded"))
    );
    let owner = stored_row(dir.path(), &id)["owner"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        owner.starts_with(&format!("{}:", daemon.pid())),
        "the daemon carried it out: {owner}"
    );
    // `--format json` prints the agent events as recorded, one per line.
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "again", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines.iter().any(|l| l["type"] == "agent.tool_call"),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["run_id"].as_str().is_some_and(|r| r != id))
    );
}

#[test]
fn ctrl_c_asks_the_daemon_to_cancel_its_run_and_exits_130() {
    let tmp = tempfile::tempdir().unwrap();
    let pid_file = tmp.path().join("pid");
    let dir = hanging(repo_without_servers, &pid_file);
    let _daemon = Daemon::start_in(dir.path());
    let (mut child, pid) = start_hanging_run(dir.path(), "go", &pid_file);
    interrupt(&mut child, pid);
    let id = started_run_id(dir.path());
    assert_eq!(row_of(dir.path(), &id).unwrap()["state"], "cancelled");
}

#[test]
fn a_daemon_interrupts_the_run_of_a_killed_npc_run_and_leaves_a_live_ones_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo_without_servers(
        "claude_code",
        CLAUDE_TOOL_CALL,
        &[
            ("FAKE_AGENT_HANG", "1"),
            (
                "FAKE_AGENT_PID_FILE",
                tmp.path().join("pid").to_str().unwrap(),
            ),
        ],
    );
    let start = |prompt: &str| start_hanging_run(dir.path(), prompt, &tmp.path().join("pid"));
    // The live run first: a run started later would interrupt the killed
    // one itself (every run in process sweeps first).
    let (mut live, live_agent) = start("one");
    let (mut killed, killed_agent) = start("two");
    killed.kill().unwrap(); // SIGKILL: its row stays `running`
    killed.wait().unwrap();
    wait_for(
        "the killed run's agent to be stopped by its watchdog",
        || (!alive(killed_agent as u32)).then_some(()),
    );
    let running: Vec<String> = wait_for("both rows running", || {
        let ids: Vec<String> = run_rows(dir.path())
            .into_iter()
            .filter(|r| r["state"] == "running")
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect();
        (ids.len() == 2).then_some(ids)
    });
    // Newest first: the killed run, then the live one.
    let (killed_id, live_id) = (running[0].clone(), running[1].clone());
    let daemon = Daemon::start_in(dir.path());
    daemon.wait_event(0, "run.interrupted");
    // One pass decided both: the killed run's row is interrupted, the live one's is not.
    assert_eq!(
        row_of(dir.path(), &killed_id).unwrap()["state"],
        "interrupted"
    );
    assert_eq!(row_of(dir.path(), &live_id).unwrap()["state"], "running");
    assert!(alive(live_agent as u32));
    kill(Pid::from_raw(live.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(live.wait().unwrap().code(), Some(130));
    assert_eq!(row_of(dir.path(), &live_id).unwrap()["state"], "cancelled");
}

/// A Claude Code stream that claims success after a refused call (its
/// `result` lists the refusal in `permission_denials`).
const REFUSED_THEN_SUCCESS: &str = r#"{"type":"system","subtype":"init","session_id":"s1","model":"m"}
{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"touch x"}}]}}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"Claude requested permissions to use Bash, but you haven't granted it yet.","is_error":true}]}}
{"type":"assistant","message":{"content":[{"type":"text","text":"Done! Everything worked."}]}}
{"type":"result","subtype":"success","is_error":false,"result":"Done! Everything worked.","permission_denials":[{"tool_name":"Bash","tool_use_id":"t1","tool_input":{"command":"touch x"}}],"usage":{}}
"#;

/// The lines of `npc runs show ID` that say how the run ended (no times).
fn show_outcome(dir: &Path, id: &str) -> String {
    let out = npc()
        .current_dir(dir)
        .args(["runs", "show", id])
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            ["run ", "detail:", "outcome:", "denied:"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .map(|l| l.replace(id, "RUN"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A refused tool call ends the run `blocked`, not `succeeded`, however the
/// stream ends; `npc run` exits 3 and says what was denied; the refusal is
/// a `tool.denied` event of the run (`by: cli`); `npc runs` and `npc runs
/// show` carry the state and the denials.
#[test]
fn a_refused_tool_call_ends_the_run_blocked_with_the_denial_listed() {
    let fixture = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(fixture.path(), REFUSED_THEN_SUCCESS).unwrap();
    let dir = repo_without_servers("claude_code", &fixture.path().to_string_lossy(), &[]);
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "touch x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error:") || l.contains("refused"))
        .collect();
    insta::assert_snapshot!("blocked_run_stderr", said.join("\n"));
    let id = started_run_id(dir.path());
    let finished = finished(dir.path());
    assert_eq!(finished["payload"]["outcome"], "blocked", "{finished}");
    assert_eq!(finished["payload"]["reason"], "denied", "{finished}");
    assert_eq!(finished["payload"]["exit_code"], 3, "{finished}");
    let denials = &finished["payload"]["denials"];
    assert_eq!(denials[0]["tool"], "Bash", "{finished}");
    assert_eq!(denials[0]["by"], "cli", "{finished}");
    // No pattern of the profile explains it: the CLI's own rules.
    assert_eq!(
        denials[0]["rule"], "the CLI's permission rules",
        "{finished}"
    );
    let recorded: Vec<Value> = events(dir.path())
        .into_iter()
        .filter(|e| e["kind"] == "tool.denied")
        .collect();
    assert_eq!(recorded.len(), 1, "{recorded:#?}");
    assert_eq!(recorded[0]["payload"]["run_id"], id.as_str());
    assert_eq!(recorded[0]["payload"]["profile"], "dev");
    assert_eq!(recorded[0]["payload"]["by"], "cli");
    let row = row_of(dir.path(), &id).unwrap();
    assert_eq!(row["state"], "blocked", "{row}");
    assert_eq!(row["denials"][0]["tool"], "Bash", "{row}");
    assert!(
        row["detail"]
            .as_str()
            .unwrap()
            .contains("`Bash` denied by cli"),
        "{row}"
    );
    insta::assert_snapshot!("blocked_run_show", show_outcome(dir.path(), &id));
}

/// A provider command that records `tool.denied` events in the store as a
/// hook or gateway process of the run would (`run_id` from `$NPC_RUN_ID`,
/// or another run's id), then replays `fixture` as the agent.
fn denying_agent(dir: &Path, run_id: &str, fixture: &str) {
    let script = dir.join("deny-then-agent.py");
    std::fs::write(
        &script,
        format!(
            r#"#!/usr/bin/env python3
import json, os, sqlite3, sys, time
run = {run_id:?}.replace("$NPC_RUN_ID", os.environ["NPC_RUN_ID"])
db = sqlite3.connect(".npc/state.db", timeout=30)
payload = {{"run_id": run, "tool": "everything__echo", "rule": "everything__*", "by": "gateway", "reason": "denied_tools"}}
db.execute("INSERT INTO events (ts_ms, kind, component, payload) VALUES (?, 'tool.denied', ?, ?)",
           (int(time.time() * 1000), "run." + run, json.dumps(payload)))
db.commit()
db.close()
os.execv(sys.executable, [sys.executable, {agent:?}, "--provider", "claude_code", "--fixture", {fixture:?}])
"#,
            agent = repo_root()
                .join("fixtures/clis/fake-agent.py")
                .display()
                .to_string(),
            fixture = repo_root().join("fixtures/clis").join(fixture).display().to_string(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = dir.join("npcagent.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let start = text.find("command = ").unwrap();
    let end = start + text[start..].find("\nenv").unwrap();
    let text = format!(
        "{}command = {}\nargs = []{}",
        &text[..start],
        toml_str(&script.display().to_string()),
        &text[end..]
    );
    std::fs::write(manifest, text).unwrap();
}

/// A denial recorded for the run (by its gateway, in another process)
/// blocks it; one recorded for another run id does not.
#[test]
fn a_denial_of_the_run_blocks_it_and_one_of_another_run_does_not() {
    let dir = repo_without_servers("claude_code", CLAUDE_TOOL_CALL, &[]);
    denying_agent(dir.path(), "run-someone-else-0", CLAUDE_TOOL_CALL);
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "echo"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(finished(dir.path())["payload"]["outcome"], "succeeded");

    let dir = repo_without_servers("claude_code", CLAUDE_TOOL_CALL, &[]);
    denying_agent(dir.path(), "$NPC_RUN_ID", CLAUDE_TOOL_CALL);
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "echo"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let finished = finished(dir.path());
    assert_eq!(finished["payload"]["outcome"], "blocked", "{finished}");
    let denials = finished["payload"]["denials"].as_array().unwrap();
    assert_eq!(denials.len(), 1, "{finished}");
    assert_eq!(denials[0]["by"], "gateway");
    assert_eq!(denials[0]["tool"], "everything__echo");
    assert_eq!(denials[0]["reason"], "denied_tools");
    let id = started_run_id(dir.path());
    assert_eq!(row_of(dir.path(), &id).unwrap()["state"], "blocked");
}

/// A Claude Code run in place whose `.claude/settings.json` Claude Code
/// would ignore (the repository is untrusted) says so with the fix, rather
/// than run as if the settings applied; trusted, it says nothing.
#[test]
fn an_untrusted_claude_run_in_place_warns_with_the_fix() {
    let dir = repo_without_servers("claude_code", CLAUDE_TOOL_CALL, &[]);
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join(".claude")).unwrap();
    std::fs::write(root.join(".claude/settings.json"), "{}").unwrap();
    let home = tempfile::tempdir().unwrap();
    let run = || {
        npc()
            .current_dir(&root)
            .args(["run", "dev", "--prompt", "hi"])
            .env("HOME", home.path())
            .env_remove("CLAUDE_CONFIG_DIR")
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    let fix = format!(
        "projects[\"{}\"].hasTrustDialogAccepted` to `true` in `{}`",
        root.display(),
        home.path().join(".claude.json").display()
    );
    assert!(
        said.contains("warning: Claude Code does not trust"),
        "{said}"
    );
    assert!(said.contains(&fix), "{said}");
    std::fs::write(
        home.path().join(".claude.json"),
        serde_json::json!({ "projects": { root.to_string_lossy(): { "hasTrustDialogAccepted": true } } })
            .to_string(),
    )
    .unwrap();
    let out = run();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("does not trust"), "{said}");
}

/// `npc run PROFILE --provider NAME`: the same profile with another CLI, in
/// the process and through a daemon; an unknown provider is a usage error
/// that lists the known ones.
#[test]
fn provider_override_runs_the_profile_with_another_cli() {
    let argv_dir = tempfile::tempdir().unwrap();
    let argv_file = argv_dir.path().join("argv.json");
    let dir = repo_without_servers("claude_code", "claude_code/2.1.197/tool_call.jsonl", &[]);
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let fixture = repo_root().join("fixtures/clis/codex/0.171.0/tool_call.jsonl");
    let path = dir.path().join("npcagent.toml");
    let mut manifest = std::fs::read_to_string(&path).unwrap();
    manifest.push_str(&format!(
        "\n[providers.other]\nkind = \"codex\"\ncommand = {}\nargs = [\"--provider\", \"codex\", \"--fixture\", {}]\nenv = {{ FAKE_AGENT_ARGV_FILE = {} }}\n",
        toml_str(&agent.display().to_string()),
        toml_str(&fixture.display().to_string()),
        toml_str(argv_file.to_str().unwrap()),
    ));
    std::fs::write(&path, manifest).unwrap();
    let run = |args: &[&str]| npc().current_dir(dir.path()).args(args).output().unwrap();
    let out = run(&["run", "dev", "--provider", "other", "--prompt", "go"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("provider `other`"), "{stderr}");
    // Codex's argv, not Claude Code's.
    let argv: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(&argv_file).unwrap()).unwrap();
    assert_eq!(&argv[..2], ["exec", "--json"], "{argv:?}");
    let out = run(&["run", "dev", "--provider", "nope", "--prompt", "go"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("nope"), "{stderr}");
    // Through a daemon: the row's request carries the provider.
    std::fs::remove_file(&argv_file).unwrap();
    let d = crate::support::Daemon::start_in(dir.path());
    let out = d.npc_output(&["run", "dev", "--provider", "other", "--prompt", "go"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let argv: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(&argv_file).unwrap()).unwrap();
    assert_eq!(&argv[..2], ["exec", "--json"], "{argv:?}");
}
