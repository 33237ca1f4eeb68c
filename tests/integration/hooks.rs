//! Lifecycle hooks through the real binary with real hook scripts:
//! `npc hook run` (npc's own protocol and the native protocols of Claude
//! Code and Gemini CLI), the hooks around the MCP gateway's `tools/call`
//! (standalone and in the daemon, swapped live on reload), and the agent
//! events of `npc run`. Every case is a table row: the hooks, the input, and
//! what must come out (exit status, answer, recorded `hook.call` events).

use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::{alive, npc, repo_root, wait_for};

/// A repository with `hooks` (TOML `[[hooks.*]]` entries) as its manifest
/// and `scripts` (name, shell body) as executable files under `hooks/`.
fn repo(hooks: &str, scripts: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("hooks")).unwrap();
    for (name, body) in scripts {
        let path = dir.path().join("hooks").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(
        dir.path().join("npcagent.toml"),
        format!("version = 1\n{hooks}"),
    )
    .unwrap();
    dir
}

/// `npc hook run EVENT` in `dir` with `input` on stdin.
fn hook_run(dir: &Path, args: &[&str], input: &Value) -> std::process::Output {
    npc()
        .current_dir(dir)
        .args(["hook", "run"])
        .args(args)
        .write_stdin(input.to_string())
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap()
}

fn recorded(dir: &Path) -> Vec<Value> {
    let out = npc()
        .current_dir(dir)
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "hook.call")
        .collect()
}

fn push_call() -> Value {
    json!({"tool_call": {"id": "c1", "name": "shell__run", "arguments": {"cmd": "git push"}}})
}

/// One row of the `before_tool` table.
struct Case {
    name: &'static str,
    /// `[[hooks.before_tool]]` entries, `{dir}` replaced by the repository.
    hooks: &'static str,
    scripts: &'static [(&'static str, &'static str)],
    exit: i32,
    /// Substrings the answer (stdout + stderr) must contain.
    says: &'static [&'static str],
    /// Recorded decisions, in order.
    decisions: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "continue",
        hooks: "[[hooks.before_tool]]\ncommand = \"./hooks/ok\"\n",
        scripts: &[("ok", "cat > /dev/null; echo '{\"decision\":\"continue\"}'")],
        exit: 0,
        says: &["{\"decision\":\"continue\"}"],
        decisions: &["continue"],
    },
    Case {
        name: "empty stdout continues",
        hooks: "[[hooks.before_tool]]\ncommand = \"./hooks/quiet\"\n",
        scripts: &[("quiet", "cat > /dev/null")],
        exit: 0,
        says: &["continue"],
        decisions: &["continue"],
    },
    Case {
        name: "deny without reason fails closed",
        hooks: "[[hooks.before_tool]]\ncommand = \"./hooks/deny\"\n",
        scripts: &[("deny", "echo '{\"decision\":\"deny\"}'")],
        exit: 1,
        says: &[
            "\"decision\":\"deny\"",
            "non-empty `reason`",
            "before_tool[0]",
        ],
        decisions: &["failed"],
    },
    Case {
        name: "rewrite chain then deny",
        hooks: "[[hooks.before_tool]]\ncommand = \"./hooks/a\"\n\
                [[hooks.before_tool]]\ncommand = \"./hooks/b\"\n\
                [[hooks.before_tool]]\ncommand = \"./hooks/c\"\n\
                [[hooks.before_tool]]\ncommand = \"./hooks/never\"\n",
        scripts: &[
            (
                "a",
                "grep -q '\"cmd\":\"git push\"' && echo '{\"decision\":\"rewrite\",\"arguments\":{\"cmd\":\"git push\",\"a\":1}}'",
            ),
            (
                "b",
                "grep -q '\"a\":1' && echo '{\"decision\":\"rewrite\",\"arguments\":{\"cmd\":\"git push\",\"a\":1,\"b\":2}}'",
            ),
            (
                "c",
                "grep -q '\"a\":1,\"b\":2' && echo '{\"decision\":\"deny\",\"reason\":\"pushing is reviewed by a human\"}'",
            ),
            ("never", "touch never-ran-marker"),
        ],
        exit: 1,
        says: &["pushing is reviewed by a human", "before_tool[2]"],
        decisions: &["rewrite", "rewrite", "deny"],
    },
    Case {
        name: "garbage output fails closed",
        hooks: "[[hooks.before_tool]]\ncommand = \"./hooks/garbage\"\n",
        scripts: &[("garbage", "echo 'sure, go ahead'")],
        exit: 1,
        says: &["not one JSON object"],
        decisions: &["failed"],
    },
    Case {
        name: "more than 2 MiB of output fails closed",
        hooks: "[[hooks.before_tool]]\ncommand = \"./hooks/flood\"\n",
        scripts: &[("flood", "head -c 2200000 /dev/zero | tr '\\0' a")],
        exit: 1,
        says: &["more than 1048576 bytes"],
        decisions: &["failed"],
    },
    Case {
        name: "sleep past the timeout fails closed",
        hooks: "[[hooks.before_tool]]\ncommand = \"./hooks/slow\"\ntimeout_ms = 300\n",
        scripts: &[(
            "slow",
            "read -r p _ </proc/self/stat; echo \"$p\" > slow.pid; exec sleep 30",
        )],
        exit: 1,
        says: &["timeout of 300 ms"],
        decisions: &["failed"],
    },
    Case {
        name: "exit 1 fails closed and quotes stderr",
        hooks: "[[hooks.before_tool]]\ncommand = \"./hooks/crash\"\n",
        scripts: &[("crash", "echo 'policy file missing' >&2; exit 1")],
        exit: 1,
        says: &["exit code 1", "policy file missing"],
        decisions: &["failed"],
    },
    Case {
        name: "missing executable fails closed",
        hooks: "[[hooks.before_tool]]\ncommand = \"./hooks/not-there\"\n",
        scripts: &[],
        exit: 1,
        says: &["could not be started", "not-there"],
        decisions: &["failed"],
    },
    Case {
        name: "matcher skips other tools",
        hooks: "[[hooks.before_tool]]\ncommand = \"./hooks/deny\"\nmatcher = \"^fs__\"\n",
        scripts: &[("deny", "echo '{\"decision\":\"deny\",\"reason\":\"no\"}'")],
        exit: 0,
        says: &["continue"],
        decisions: &[],
    },
];

#[test]
fn before_tool_table() {
    for case in CASES {
        let dir = repo(case.hooks, case.scripts);
        let out = hook_run(dir.path(), &["before_tool"], &push_call());
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(case.exit), "{}: {text}", case.name);
        for s in case.says {
            assert!(text.contains(s), "{}: missing `{s}` in {text}", case.name);
        }
        let decisions: Vec<String> = recorded(dir.path())
            .iter()
            .map(|e| e["payload"]["decision"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(decisions, case.decisions, "{}", case.name);
        assert!(
            !dir.path().join("never-ran-marker").exists(),
            "{}: a hook after the deny ran",
            case.name
        );
        if let Ok(pid) = std::fs::read_to_string(dir.path().join("slow.pid")) {
            let pid: u32 = pid.trim().parse().unwrap();
            wait_for("the timed-out hook to be killed", || {
                (!alive(pid)).then_some(())
            });
        }
    }
}

#[test]
fn hook_calls_are_recorded_in_the_state_directory_the_manifest_names() {
    let dir = repo(
        &format!(
            "[project]\nname = \"p\"\nstate_dir = \".state\"\n{}",
            deny_hook("shell__run", "no pushing")
        ),
        &[],
    );
    let out = hook_run(dir.path(), &["before_tool"], &push_call());
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join(".state/state.db").is_file());
    assert!(!dir.path().join(".npc/state.db").exists());
    let decisions: Vec<Value> = recorded(dir.path())
        .iter()
        .map(|e| e["payload"]["decision"].clone())
        .collect();
    assert_eq!(decisions, [json!("deny")]);
}

#[test]
fn a_matching_hooks_record_survives_a_crash_right_after_the_answer() {
    use std::io::{BufRead as _, Write as _};
    let dir = repo(&deny_hook("shell__run", "no pushing"), &[]);
    for n in 1..=3 {
        let mut child = std::process::Command::new(crate::support::npc_path())
            .current_dir(dir.path())
            .args(["hook", "run", "before_tool"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(push_call().to_string().as_bytes()).unwrap();
        drop(stdin);
        // The answer is written once the record is committed and synced:
        // kill the process the moment it appears (a crash before it closes
        // its store; when it already exited, the kill finds nothing).
        let mut answer = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut answer)
            .unwrap();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.wait();
        assert!(answer.contains("deny"), "{answer}");
        // Closing never folds the WAL in: what it holds is what a crash
        // leaves, and the record is in it.
        assert!(dir.path().join(".npc/state.db-wal").is_file());
        let decisions: Vec<Value> = recorded(dir.path())
            .iter()
            .map(|e| e["payload"]["decision"].clone())
            .collect();
        assert_eq!(decisions, vec![json!("deny"); n], "after call {n}");
    }
}

#[test]
fn the_envelope_and_environment_a_hook_gets() {
    let dir = repo(
        "[[hooks.before_tool]]\ncommand = \"./hooks/spy\"\nargs = [\"${NPC_TEST_HOOK_ARG}\"]\n\
         env = { DECLARED = \"yes\" }\n",
        &[(
            "spy",
            "cat > seen.json; printf '%s|%s|%s|%s' \"$1\" \"$DECLARED\" \"${UNDECLARED:-unset}\" \"$(pwd)\" > env.txt",
        )],
    );
    let out = npc()
        .current_dir(dir.path())
        .env("NPC_TEST_HOOK_ARG", "from-env")
        .env("UNDECLARED", "leaked")
        .args(["hook", "run", "before_tool"])
        .write_stdin(push_call().to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let seen: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("seen.json")).unwrap()).unwrap();
    assert_eq!(
        seen,
        json!({"version": 1, "event": "before_tool", "plugin": null,
               "payload": {"tool_call": {"id": "c1", "name": "shell__run", "arguments": {"cmd": "git push"}}}})
    );
    let env = std::fs::read_to_string(dir.path().join("env.txt")).unwrap();
    let root = dir.path().canonicalize().unwrap();
    assert_eq!(env, format!("from-env|yes|unset|{}", root.display()));
}

#[test]
fn after_tool_replaces_output_and_observers_are_best_effort() {
    let dir = repo(
        "[[hooks.after_tool]]\ncommand = \"./hooks/redact\"\n\
         [[hooks.on_agent_end]]\ncommand = \"./hooks/broken\"\n\
         [[hooks.on_agent_end]]\ncommand = \"./hooks/after-broken\"\n\
         [[hooks.on_agent_start]]\ncommand = \"./hooks/broken\"\n",
        &[
            (
                "redact",
                "grep -q 'sk-123' && echo '{\"output\":\"[redacted]\",\"is_error\":false}'",
            ),
            ("broken", "exit 3"),
            ("after-broken", "cat > end.json"),
        ],
    );
    let input = json!({"tool_call": {"id": "c", "name": "kv__get", "arguments": {}},
                       "result": {"output": "token sk-123", "is_error": true}});
    let out = hook_run(dir.path(), &["after_tool"], &input);
    assert!(out.status.success(), "{out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer, json!({"output": "[redacted]", "is_error": false}));

    // A best-effort observer's failure is recorded, the next one still runs.
    let out = hook_run(dir.path(), &["on_agent_end"], &json!({"messages": []}));
    assert!(out.status.success(), "{out:?}");
    let end: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("end.json")).unwrap()).unwrap();
    assert_eq!(end["event"], "on_agent_end");
    // A deterministic observer's failure stops what it guards.
    let out = hook_run(dir.path(), &["on_agent_start"], &json!({"messages": []}));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("exit code 3"));
}

#[test]
fn invalid_input_or_manifest_fails_closed() {
    let dir = repo("[[hooks.before_tool]]\ncommand = \"true\"\n", &[]);
    let out = npc()
        .current_dir(dir.path())
        .args(["hook", "run", "before_tool"])
        .write_stdin("not json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["decision"], "deny");
    // The reason says what happened; it names no hook and no command.
    assert!(
        answer["reason"].as_str().unwrap().starts_with(
            "npc denies this tool call because it could not run the hooks: the hook input on stdin is not a JSON object"
        ),
        "{answer}"
    );
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[[hooks.before_tool]]\n",
    )
    .unwrap();
    let out = hook_run(
        dir.path(),
        &["before_tool", "--agent", "claude"],
        &claude_payload("ls"),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is invalid"));
}

/// A `PreToolUse` input as Claude Code 2.1 builds it for its Bash tool
/// (the fields of its hook input: the session part, then the event's).
fn claude_payload(command: &str) -> Value {
    let mut v: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("fixtures/hooks/claude-pretooluse-bash.json"))
            .unwrap(),
    )
    .unwrap();
    v["tool_input"]["command"] = command.into();
    v
}

const NO_PUSH: &str =
    "[[hooks.before_tool]]\ncommand = \"./hooks/no-push\"\nmatcher = \"^Bash$\"\n";
const NO_PUSH_SCRIPT: (&str, &str) = (
    "no-push",
    "if grep -q '\"command\":\"git push'; then echo '{\"decision\":\"deny\",\"reason\":\"git push is not allowed from agents\"}'; fi",
);

#[test]
fn a_manifest_deny_stops_claude_codes_bash_git_push() {
    let dir = repo(NO_PUSH, &[NO_PUSH_SCRIPT]);
    // Claude Code runs the managed entry's command through its shell, with
    // the hook input on stdin; exit status 2 blocks the tool and hands
    // stderr to the model.
    let out = hook_run(
        dir.path(),
        &["before_tool", "--agent", "claude"],
        &claude_payload("git push origin main"),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("git push is not allowed from agents (hook before_tool[0])"),
        "{out:?}"
    );
    let out = hook_run(
        dir.path(),
        &["before_tool", "--agent", "claude"],
        &claude_payload("git status"),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");

    // Gemini CLI: a `deny` decision on stdout, exit 0.
    let mut gemini = claude_payload("git push");
    gemini["hook_event_name"] = "BeforeTool".into();
    gemini["tool_name"] = "Bash".into();
    let out = hook_run(dir.path(), &["before_tool", "--agent", "gemini"], &gemini);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["decision"], "deny");
}

/// A `[mcp.servers.NAME]` entry running `fixtures/mcp/misbehave.py`.
fn misbehave(name: &str) -> String {
    format!(
        "[mcp.servers.{name}]\ncommand = \"python3\"\nargs = [{:?}]\ntool_timeout_ms = 5000\n",
        repo_root()
            .join("fixtures/mcp/misbehave.py")
            .display()
            .to_string()
    )
}

/// A hook running `sh -c SCRIPT`.
pub(crate) fn sh_hook(event: &str, script: &str, matcher: &str) -> String {
    format!(
        "[[hooks.{event}]]\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nmatcher = {matcher:?}\n"
    )
}

pub(crate) fn deny_hook(matcher: &str, reason: &str) -> String {
    sh_hook(
        "before_tool",
        &format!("echo '{{\"decision\":\"deny\",\"reason\":\"{reason}\"}}'"),
        matcher,
    )
}

#[test]
fn the_gateway_runs_tool_hooks_around_each_call() {
    if !crate::mcp::python_sdk() {
        return;
    }
    let manifest = format!(
        "version = 1\n{}{}{}{}",
        misbehave("bad"),
        deny_hook("^bad__crash$", "crashing is not allowed here"),
        sh_hook(
            "before_tool",
            "echo '{\"decision\":\"rewrite\",\"arguments\":{\"x\":1}}'",
            "^bad__ok$"
        ),
        sh_hook(
            "after_tool",
            "in=$(cat); echo \"$in\" | grep -q '\"arguments\":{\"x\":1}' && echo \"$in\" | grep -q '\"output\":\"fine\"' && echo '{\"output\":\"replaced\"}'",
            "^bad__ok$"
        ),
    );
    let dir = crate::mcp::repo(&manifest);
    let got = crate::mcp::stdio_session(
        &dir,
        json!([
            ["call", "bad__crash", {}],
            ["call", "bad__ok", {}],
            ["call", "bad__pid", {}]
        ]),
    );
    assert_eq!(got[0]["is_error"], true, "{got:?}");
    assert!(
        got[0]["text"]
            .as_str()
            .unwrap()
            .contains("crashing is not allowed here"),
        "{got:?}"
    );
    assert_eq!(got[1]["text"], "replaced", "{got:?}");
    // The denied crash never reached the server: it still answers.
    assert_eq!(got[2]["is_error"], false, "{got:?}");
    let calls: Vec<Value> = recorded(dir.path())
        .into_iter()
        .map(|e| json!([e["payload"]["tool"], e["payload"]["decision"]]))
        .collect();
    assert_eq!(
        calls,
        [
            json!(["bad__crash", "deny"]),
            json!(["bad__ok", "rewrite"]),
            json!(["bad__ok", "replace"]),
        ]
    );
}

#[test]
fn the_daemons_gateway_swaps_its_hooks_on_reload() {
    if !crate::mcp::python_sdk() {
        return;
    }
    let base = format!("version = 1\n{}", misbehave("a"));
    let d =
        crate::support::Daemon::start(&format!("{base}{}", deny_hook("^a__ok$", "first policy")));
    let text = |got: &Vec<Value>| got[0]["text"].as_str().unwrap_or("").to_string();
    let got = crate::mcp::stdio_session_in(d.root(), json!([["call", "a__ok", {}]]));
    assert!(text(&got).contains("first policy"), "{got:?}");
    let pid = crate::mcp::stdio_session_in(d.root(), json!([["call", "a__pid", {}]]));
    d.write_manifest(&format!("{base}{}", deny_hook("^a__ok$", "second policy")));
    wait_for("the new hook to apply", || {
        let got = crate::mcp::stdio_session_in(d.root(), json!([["call", "a__ok", {}]]));
        text(&got).contains("second policy").then_some(())
    });
    d.write_manifest(&base);
    wait_for("the hook to be removed", || {
        let got = crate::mcp::stdio_session_in(d.root(), json!([["call", "a__ok", {}]]));
        (text(&got) == "fine").then_some(())
    });
    // Nothing else restarted: the server is the same process.
    let again = crate::mcp::stdio_session_in(d.root(), json!([["call", "a__pid", {}]]));
    assert_eq!(pid[0]["text"], again[0]["text"]);
}

/// A repository whose profile `dev` runs the fake agent replaying a Claude
/// Code transcript with a tool call, plus `hooks`; every hook script
/// `./hooks/log` appends its event name to `hook.log`.
fn run_repo(hooks: &str, scripts: &[(&str, &str)]) -> TempDir {
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let fixture = repo_root().join("fixtures/clis/claude_code/2.1.197/tool_call.jsonl");
    let manifest = format!(
        "[providers.fake]\nkind = \"claude_code\"\ncommand = {:?}\nargs = [\"--provider\", \"claude_code\", \"--fixture\", {:?}]\n\
         [profiles.dev]\nprovider = \"fake\"\ndescription = \"d\"\n{hooks}",
        agent.display().to_string(),
        fixture.display().to_string(),
    );
    let mut all = vec![(
        "log",
        "in=$(cat); echo \"$in\" | sed -n 's/.*\"event\":\"\\([a-z_]*\\)\".*/\\1/p' >> hook.log",
    )];
    all.extend_from_slice(scripts);
    repo(&manifest, &all)
}

/// One `./hooks/log` hook on every event.
fn every_event_logs() -> String {
    [
        "on_agent_start",
        "before_model",
        "after_model",
        "before_tool",
        "after_tool",
        "on_error",
        "on_agent_end",
    ]
    .iter()
    .map(|e| format!("[[hooks.{e}]]\ncommand = \"./hooks/log\"\n"))
    .collect()
}

fn hook_log(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("hook.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn npc_run_calls_the_agent_and_model_hooks_in_order() {
    let dir = run_repo(&every_event_logs(), &[]);
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "list the files"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let log = hook_log(dir.path());
    assert_eq!(
        log.first().map(String::as_str),
        Some("on_agent_start"),
        "{log:?}"
    );
    assert_eq!(
        log.get(1).map(String::as_str),
        Some("before_model"),
        "{log:?}"
    );
    assert!(log.iter().any(|e| e == "after_model"), "{log:?}");
    assert_eq!(
        log.iter().filter(|e| *e == "before_model").count(),
        2,
        "the prompt, then the tool result: {log:?}"
    );
    assert_eq!(
        log.last().map(String::as_str),
        Some("on_agent_end"),
        "{log:?}"
    );
    assert!(
        !log.iter().any(|e| e == "on_error" || e.ends_with("_tool")),
        "{log:?}"
    );
}

#[test]
fn a_failing_model_hook_stops_the_run_and_the_end_observers_still_run() {
    let hooks = format!(
        "{}[[hooks.after_model]]\ncommand = \"./hooks/refuse\"\n",
        every_event_logs()
    );
    let dir = run_repo(&hooks, &[("refuse", "echo 'not json'")]);
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "list the files"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("after_model[1] failed"),
        "{out:?}"
    );
    let log = hook_log(dir.path());
    assert_eq!(
        &log[log.len() - 2..],
        ["on_error", "on_agent_end"],
        "{log:?}"
    );
    let events = recorded(dir.path());
    assert!(events.iter().any(|e| e["payload"]["decision"] == "failed"));

    // A failing `on_agent_start` hook: the agent never starts.
    let hooks = format!(
        "{}[[hooks.on_agent_start]]\ncommand = \"./hooks/crash\"\n",
        every_event_logs()
    );
    let dir = run_repo(&hooks, &[("crash", "exit 9")]);
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "list the files"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exit code 9"),
        "{out:?}"
    );
    assert_eq!(
        hook_log(dir.path()),
        ["on_agent_start", "on_error", "on_agent_end"]
    );
    let out = npc()
        .current_dir(dir.path())
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("agent.message"));
}

/// Run a bridge entry's `command` the way its CLI does: through `sh -c` in
/// the project, with the CLI's project variable set (Gemini substitutes
/// `$GEMINI_PROJECT_DIR` with the shell-quoted path first), `npc` on `PATH`
/// and the hook input on stdin.
fn run_bridge(root: &Path, command: &str, cli: &str, input: &Value) -> std::process::Output {
    let quoted = format!("'{}'", root.display());
    let command = match cli {
        "gemini" => command.replace("$GEMINI_PROJECT_DIR", &quoted),
        _ => command.to_string(),
    };
    let bin = crate::support::npc_path();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    assert_cmd::Command::new("sh")
        .args(["-c", &command])
        .current_dir(root)
        .env("PATH", path)
        .env("CLAUDE_PROJECT_DIR", root)
        .env("GEMINI_PROJECT_DIR", root)
        .write_stdin(input.to_string())
        .output()
        .unwrap()
}

fn settings(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    let text: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn apply_writes_hook_bridges_that_stop_git_push_and_removes_them_again() {
    let providers =
        "[providers.claude]\nkind = \"claude_code\"\n[providers.gemini]\nkind = \"gemini_cli\"\n";
    let dir = repo(&format!("{providers}{NO_PUSH}"), &[NO_PUSH_SCRIPT]);
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir(root.join(".claude")).unwrap();
    std::fs::write(
        root.join(".claude/settings.json"),
        r#"{"hooks":{"PreToolUse":[{"matcher":"Bash","hooks":[{"type":"command","command":"./mine"}]}]},"model":"opus"}"#,
    )
    .unwrap();
    let plan = npc().current_dir(&root).args(["plan"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&plan.stdout).contains(".claude/settings.json"),
        "{plan:?}"
    );
    let out = npc()
        .current_dir(&root)
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let claude = settings(&root.join(".claude/settings.json"));
    assert_eq!(claude["model"], "opus");
    let groups = claude["hooks"]["PreToolUse"].as_array().unwrap();
    assert_eq!(
        groups[0]["hooks"][0]["command"], "./mine",
        "the user's entry stays first"
    );
    let command = groups[1]["hooks"][0]["command"].as_str().unwrap();
    let push = claude_payload("git push --force origin main");
    let out = run_bridge(&root, command, "claude", &push);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("git push is not allowed from agents"));
    let out = run_bridge(&root, command, "claude", &claude_payload("cargo test"));
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let gemini = settings(&root.join(".gemini/settings.json"));
    let command = gemini["hooks"]["BeforeTool"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap();
    let mut input = push.clone();
    input["hook_event_name"] = "BeforeTool".into();
    let out = run_bridge(&root, command, "gemini", &input);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["decision"], "deny", "{answer}");

    // The hooks leave the manifest: npc's entries go, the user's stay.
    std::fs::write(
        root.join("npcagent.toml"),
        format!("version = 1\n{providers}"),
    )
    .unwrap();
    let out = npc()
        .current_dir(&root)
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let claude = settings(&root.join(".claude/settings.json"));
    assert_eq!(claude["hooks"]["PreToolUse"].as_array().unwrap().len(), 1);
    assert_eq!(
        claude["hooks"]["PreToolUse"][0]["hooks"][0]["command"],
        "./mine"
    );
    let gemini = settings(&root.join(".gemini/settings.json"));
    assert!(gemini.get("hooks").is_none(), "{gemini}");
}

/// A plugin package at `kit/` in `dir` whose hooks file has `hooks` (JSON).
fn plugin_kit(dir: &Path, name: &str, hooks: Value) {
    let kit = dir.join("kit");
    std::fs::create_dir_all(kit.join("dev.npcagent")).unwrap();
    std::fs::write(
        kit.join("plugin.json"),
        json!({"$schema": "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json", "name": name})
            .to_string(),
    )
    .unwrap();
    std::fs::write(
        kit.join("dev.npcagent/hooks.json"),
        json!({"version": 1, "hooks": hooks}).to_string(),
    )
    .unwrap();
}

#[test]
fn npc_run_runs_plugin_hooks_after_the_manifests_with_plugin_root_and_data() {
    let data = tempfile::tempdir().unwrap();
    let dir = run_repo(
        "[[hooks.on_agent_start]]\ncommand = \"./hooks/log\"\n[[hooks.on_agent_end]]\ncommand = \"./hooks/log\"\n[plugins.kit]\npath = \"kit\"\n",
        &[],
    );
    // The plugin's hooks run in the package root; they log where they run.
    let log = json!([{"command": "sh", "args": ["-c", "cat >/dev/null; echo \"plugin:$PLUGIN_ROOT:$PLUGIN_DATA:$(pwd)\" >> ../hook.log"]}]);
    plugin_kit(
        dir.path(),
        "ordered",
        json!({"on_agent_start": log, "on_agent_end": log}),
    );
    let out = npc()
        .env("XDG_DATA_HOME", data.path())
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "list the files"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let kit = dir.path().join("kit").canonicalize().unwrap();
    let plugin_line = format!(
        "plugin:{}:{}:{}",
        kit.display(),
        data.path().join("npc/plugin-data/ordered").display(),
        kit.display()
    );
    assert_eq!(
        hook_log(dir.path()),
        [
            "on_agent_start".to_string(),
            plugin_line.clone(),
            "on_agent_end".to_string(),
            plugin_line
        ]
    );
}

#[test]
fn a_failing_plugin_hook_fails_closed_like_the_manifests() {
    let data = tempfile::tempdir().unwrap();
    let dir = repo("", &[]);
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[plugins.kit]\npath = \"kit\"\n",
    )
    .unwrap();
    plugin_kit(
        dir.path(),
        "broken-hook",
        json!({"before_tool": [{"command": "sh", "args": ["-c", "echo not json"]}]}),
    );
    let out = npc()
        .env("XDG_DATA_HOME", data.path())
        .current_dir(dir.path())
        .args(["hook", "run", "before_tool"])
        .write_stdin(push_call().to_string())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["decision"], "deny");
    assert!(
        answer["reason"]
            .as_str()
            .unwrap()
            .contains("hook plugin `kit` before_tool[0] failed"),
        "{answer}"
    );
}

#[test]
fn apply_writes_a_codex_hook_bridge_that_stops_git_push() {
    let providers = "[providers.codex]\nkind = \"codex\"\n";
    let dir = repo(&format!("{providers}{NO_PUSH}"), &[NO_PUSH_SCRIPT]);
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir(root.join(".codex")).unwrap();
    std::fs::write(
        root.join(".codex/hooks.json"),
        r#"{"hooks":{"SessionStart":[{"matcher":"startup","hooks":[{"type":"command","command":"./mine"}]}]}}"#,
    )
    .unwrap();
    let out = npc()
        .current_dir(&root)
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let codex = settings(&root.join(".codex/hooks.json"));
    assert_eq!(
        codex["hooks"]["SessionStart"][0]["hooks"][0]["command"],
        "./mine"
    );
    let group = &codex["hooks"]["PreToolUse"][0];
    assert!(group.get("matcher").is_none(), "{group}");
    assert_eq!(group["hooks"][0]["type"], "command");
    assert!(group["hooks"][0]["timeout"].as_u64().unwrap() >= 10);
    // Codex runs the command through its shell in the session's directory
    // with the input (the recorded shape of its schema) on stdin; exit
    // status 2 with a reason on stderr blocks the tool.
    let command = group["hooks"][0]["command"].as_str().unwrap();
    let push: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("fixtures/hooks/codex-pretooluse-bash.json"))
            .unwrap(),
    )
    .unwrap();
    let out = run_bridge(&root, command, "codex", &push);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("git push is not allowed from agents"));
    let mut ok = push.clone();
    ok["tool_input"]["command"] = "cargo test".into();
    let out = run_bridge(&root, command, "codex", &ok);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");

    // Without tool hooks npc's entry goes and the user's stays.
    std::fs::write(
        root.join("npcagent.toml"),
        format!("version = 1\n{providers}"),
    )
    .unwrap();
    let out = npc()
        .current_dir(&root)
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let codex = settings(&root.join(".codex/hooks.json"));
    assert!(codex["hooks"].get("PreToolUse").is_none(), "{codex}");
    assert_eq!(
        codex["hooks"]["SessionStart"][0]["hooks"][0]["command"],
        "./mine"
    );
}

/// Load OpenCode's managed plugin file the way OpenCode does (an ES module
/// whose exports are plugin factories called with the project directory)
/// and call its `tool.execute.before` / `after` hooks with `calls`, each
/// `[tool, args, output]`; one JSON line per call: `{args, output}` or `{error}`.
fn opencode_calls(root: &Path, calls: Value) -> Vec<Value> {
    let harness = format!(
        r#"import {{ pathToFileURL }} from "node:url";
const mod = await import(pathToFileURL({plugin:?}).href);
for (const make of Object.values(mod)) {{
  const hooks = await make({{ directory: {root:?} }});
  for (const [i, [tool, args, out]] of {calls}.entries()) {{
    const input = {{ tool, sessionID: "s", callID: `c${{i}}` }};
    const output = {{ args }};
    try {{
      if (hooks["tool.execute.before"]) await hooks["tool.execute.before"](input, output);
      const result = {{ title: "", output: out, metadata: {{}} }};
      if (hooks["tool.execute.after"]) await hooks["tool.execute.after"](input, result);
      console.log(JSON.stringify({{ args: output.args, output: result.output }}));
    }} catch (e) {{
      console.log(JSON.stringify({{ error: String(e.message) }}));
    }}
  }}
}}
"#,
        plugin = root
            .join(".opencode/plugins/npc-hooks.js")
            .display()
            .to_string(),
        root = root.display().to_string(),
    );
    let bin = crate::support::npc_path();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = assert_cmd::Command::new("node")
        .args(["--input-type=module", "-e", &harness])
        .env("PATH", path)
        .current_dir(root)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn apply_writes_an_opencode_plugin_that_stops_git_push_and_rewrites() {
    if !crate::support::require(crate::support::Peer::program(
        "node",
        "apt-get install nodejs",
    )) {
        return;
    }
    let providers = "[providers.oc]\nkind = \"opencode\"\n";
    let hooks = format!(
        "{}{}",
        "[[hooks.before_tool]]\ncommand = \"./hooks/no-push\"\nmatcher = \"^bash$\"\n",
        sh_hook(
            "after_tool",
            "in=$(cat); echo \"$in\" | grep -q '\"output\":\"secret\"' && echo '{\"output\":\"[redacted]\"}' || true",
            "^read$"
        ),
    );
    let dir = repo(&format!("{providers}{hooks}"), &[NO_PUSH_SCRIPT]);
    let root = dir.path().canonicalize().unwrap();
    let out = npc()
        .current_dir(&root)
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let got = opencode_calls(
        &root,
        json!([
            ["bash", {"command": "git push origin main"}, ""],
            ["bash", {"command": "cargo test"}, "ok"],
            ["read", {"filePath": "a"}, "secret"]
        ]),
    );
    assert!(
        got[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("git push is not allowed from agents")),
        "{got:?}"
    );
    assert_eq!(got[1]["output"], "ok", "{got:?}");
    assert_eq!(got[2]["output"], "[redacted]", "{got:?}");

    // A user's file of that name is left alone.
    let plugin = root.join(".opencode/plugins/npc-hooks.js");
    std::fs::write(&plugin, "export const Mine = async () => ({});\n").unwrap();
    npc()
        .current_dir(&root)
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let out = npc()
        .current_dir(&root)
        .args(["plan", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is not npc's; it is left alone"),
        "{out:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&plugin).unwrap(),
        "export const Mine = async () => ({});\n"
    );

    // npc's file without tool hooks: a plugin that does nothing.
    std::fs::remove_file(&plugin).unwrap();
    npc()
        .current_dir(&root)
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    std::fs::write(
        root.join("npcagent.toml"),
        format!("version = 1\n{providers}"),
    )
    .unwrap();
    npc()
        .current_dir(&root)
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let got = opencode_calls(&root, json!([["bash", {"command": "git push"}, "pushed"]]));
    assert_eq!(got[0]["output"], "pushed", "{got:?}");
}

/// The bridge entry `npc apply` writes into `.claude/settings.json`, run
/// the way the CLIs run it (`sh -c`) with an `npc` on `PATH` that exits
/// `exit` (`None`: no `npc` at all): its exit status and stderr.
fn bridge_exit(root: &std::path::Path, bin: &std::path::Path, exit: Option<i32>) -> (i32, String) {
    use std::os::unix::fs::PermissionsExt as _;
    let npc_file = bin.join("npc");
    let _ = std::fs::remove_file(&npc_file);
    if let Some(code) = exit {
        std::fs::write(
            &npc_file,
            format!("#!/bin/sh\necho fake-npc >&2\nexit {code}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&npc_file, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let settings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join(".claude/settings.json")).unwrap())
            .unwrap();
    let command = settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap()
        .to_string();
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&command)
        .env("PATH", bin)
        .env("CLAUDE_PROJECT_DIR", root)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every bridge entry fails closed: no `npc` on `PATH` (the shell's 127)
/// or an `npc` failing any other way becomes exit 2, the block of Claude
/// Code, Codex and Gemini CLI, with the fix on stderr; npc's own block (2)
/// passes through as it is, and an allow stays an allow.
#[test]
fn a_bridge_that_cannot_run_npc_blocks_the_tool() {
    let repo = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let root = repo.path();
    std::fs::write(
        root.join("npcagent.toml"),
        "version = 1\n[providers.claude]\nkind = \"claude_code\"\n[[hooks.before_tool]]\ncommand = \"true\"\n",
    )
    .unwrap();
    crate::support::npc()
        .current_dir(root)
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let (code, stderr) = bridge_exit(root, bin.path(), None);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("exit 127") && stderr.contains("put npc on PATH"),
        "{stderr}"
    );
    let (code, stderr) = bridge_exit(root, bin.path(), Some(101));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("exit 101"), "{stderr}");
    let (code, stderr) = bridge_exit(root, bin.path(), Some(2));
    assert_eq!(code, 2);
    assert_eq!(stderr.trim(), "fake-npc");
    let (code, _) = bridge_exit(root, bin.path(), Some(0));
    assert_eq!(code, 0);
}
