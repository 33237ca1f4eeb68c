//! Approvals that wait for a person, through the real binary: a profile's
//! `ask_tools` asks about the fake agent's tool call (the agent asks `npc
//! hook run before_tool` as a CLI's hook does, `fixtures/clis/fake-agent.py`
//! `FAKE_AGENT_TOOL`), the run parks (`waiting`, `run.waiting`), and `npc
//! runs approve` / `deny`, the REST API or `approval_timeout` answer it; a
//! second answer, an answer for a run that is gone and one from another
//! account are refused; an ask with nobody to ask is a recorded denial.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use serde_json::{Value, json};

use crate::support::{Daemon, npc, npc_path, repo_root, wait_for};

const FIXTURE: &str = "claude_code/2.1.197/tool_call.jsonl";

fn toml_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// A repository whose profile `dev` (fake agent, `ask_tools = ["Bash"]`)
/// calls `Bash` `times` times, logging each call's fate to `tool.log` in
/// the returned directory; `extra` is appended to the manifest.
fn repo(times: u32, extra: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let call = json!({"id": "c1", "name": "Bash", "arguments": {"command": "echo approved"}});
    let manifest = format!(
        r#"
version = 1

[daemon]
listen = "127.0.0.1:0"

[providers.fake]
kind = "claude_code"
command = {agent}
args = ["--provider", "claude_code", "--fixture", {fixture}]
env = {{ FAKE_AGENT_TOOL = {call}, FAKE_AGENT_TOOL_LOG = {log}, FAKE_AGENT_NPC = {npc}, FAKE_AGENT_TOOL_TIMES = "{times}" }}

[prompts.task]
template = "run the tool"

[profiles.dev]
provider = "fake"
description = "asks before Bash"
prompt = "task"
ask_tools = ["Bash"]
{extra}
"#,
        agent = toml_str(
            &repo_root()
                .join("fixtures/clis/fake-agent.py")
                .display()
                .to_string()
        ),
        fixture = toml_str(
            &repo_root()
                .join("fixtures/clis")
                .join(FIXTURE)
                .display()
                .to_string()
        ),
        call = toml_str(&call.to_string()),
        log = toml_str(&tool_log(logs.path()).display().to_string()),
        npc = toml_str(&npc_path().display().to_string()),
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    (dir, logs)
}

fn tool_log(logs: &Path) -> PathBuf {
    logs.join("tool.log")
}

/// The fate of each tool call so far (`ran` or `denied: …`).
fn calls(logs: &Path) -> Vec<String> {
    std::fs::read_to_string(tool_log(logs))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `npc run dev` in `dir`, in the background (with a daemon up it is the
/// daemon's run and the command follows it).
fn start_run(dir: &Path, prompt: &str) -> Child {
    std::process::Command::new(npc_path())
        .current_dir(dir)
        .args(["run", "dev", "--prompt", prompt])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn runs(dir: &Path) -> Vec<Value> {
    let out = npc()
        .current_dir(dir)
        .args(["runs", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The id of the run that is `waiting`, once one is.
fn waiting_run(dir: &Path) -> String {
    wait_for("a run waiting for an approval", || {
        runs(dir)
            .into_iter()
            .find(|r| r["state"] == "waiting")
            .map(|r| r["id"].as_str().unwrap().to_string())
    })
}

fn events_of(dir: &Path, kind: &str) -> Vec<Value> {
    let out = npc()
        .current_dir(dir)
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == kind)
        .collect()
}

/// `npc runs VERB ID ARGS…` in `dir`: exit status, stdout, stderr.
fn answer(dir: &Path, verb: &str, id: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = npc()
        .current_dir(dir)
        .args(["runs", verb, id])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    wait_for("the run's command to end", || child.try_wait().unwrap())
}

#[test]
fn an_ask_parks_the_run_and_npc_runs_approve_lets_the_tool_run() {
    let (dir, logs) = repo(1, "");
    let _daemon = Daemon::start_in(dir.path());
    let mut run = start_run(dir.path(), "go");
    let id = waiting_run(dir.path());
    // The question is recorded with the run: tool, rule, arguments.
    let waiting = wait_for("run.waiting", || events_of(dir.path(), "run.waiting").pop());
    let p = &waiting["payload"];
    assert_eq!(p["run_id"], id.as_str());
    assert_eq!(p["tool"], "Bash");
    assert_eq!(p["profile"], "dev");
    assert_eq!(p["arguments"], json!({"command": "echo approved"}));
    assert!(p["rule"].as_str().unwrap().contains("ask_tools"), "{p}");
    assert!(calls(logs.path()).is_empty(), "the tool waits");
    let (code, stdout, stderr) = answer(dir.path(), "approve", &id, &[]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("allowed"), "{stdout}");
    assert!(wait_exit(&mut run).success());
    assert_eq!(calls(logs.path()), vec!["ran".to_string()]);
    let row = runs(dir.path())
        .into_iter()
        .find(|r| r["id"] == id.as_str())
        .unwrap();
    assert_eq!(row["state"], "succeeded", "{row}");
    let approval = events_of(dir.path(), "run.approval").pop().unwrap();
    assert_eq!(approval["payload"]["decision"], "allow");
    assert_eq!(approval["payload"]["by"], "cli");
    // A second answer finds nothing waiting; an unknown run is named.
    let (code, _, stderr) = answer(dir.path(), "approve", &id, &[]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("is succeeded: nothing waits"), "{stderr}");
    let (code, _, stderr) = answer(dir.path(), "deny", "run-nope", &[]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no run `run-nope`"), "{stderr}");
}

#[test]
fn a_deny_and_a_timeout_deny_the_call_by_approval_and_a_double_answer_is_refused() {
    // Two calls: the first denied by a person, the second left to time out.
    // Long enough that the person's deny of the first call always comes
    // first on a loaded machine.
    let (dir, logs) = repo(2, "[runs]\napproval_timeout = \"10s\"\n");
    let _daemon = Daemon::start_in(dir.path());
    let mut run = start_run(dir.path(), "go");
    let id = waiting_run(dir.path());
    let (code, stdout, stderr) = answer(
        dir.path(),
        "deny",
        &id,
        &["--reason", "not on a Friday", "--format", "json"],
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let denied: Value = serde_json::from_str(&stdout).unwrap();
    let approval = denied["approval_id"].as_str().unwrap();
    // The same approval again (a second click): refused, whatever the
    // verb, and never taken for the run's next question, which may
    // already wait.
    let (code, _, stderr) = answer(dir.path(), "approve", &id, &["--approval", approval]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "approval `{approval}` was already answered (denied)"
        )),
        "{stderr}"
    );
    let (code, _, stderr) = answer(dir.path(), "deny", &id, &["--approval", "nope"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("has no approval `nope`"), "{stderr}");
    wait_exit(&mut run);
    let fates = calls(logs.path());
    assert_eq!(fates.len(), 2, "{fates:?}");
    assert!(
        fates[0].starts_with("denied: ") && fates[0].contains("not on a Friday"),
        "{fates:?}"
    );
    assert!(fates[1].contains("approval_timeout"), "{fates:?}");
    let denied = events_of(dir.path(), "tool.denied");
    let reasons: Vec<&str> = denied
        .iter()
        .filter(|e| e["payload"]["run_id"] == id.as_str())
        .inspect(|e| {
            assert_eq!(e["payload"]["by"], "approval");
            assert_eq!(e["payload"]["tool"], "Bash");
        })
        .map(|e| e["payload"]["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons.len(), 2, "{denied:?}");
    assert_eq!(reasons[0], "not on a Friday");
    assert!(
        reasons[1].contains("nobody answered within 10s"),
        "{reasons:?}"
    );
    let decisions: Vec<Value> = events_of(dir.path(), "run.approval")
        .into_iter()
        .map(|e| e["payload"]["decision"].clone())
        .collect();
    assert_eq!(decisions, vec![json!("deny"), json!("timeout")]);
}

#[test]
fn approve_always_lets_the_identical_calls_of_the_run_through() {
    let (dir, logs) = repo(3, "");
    let _daemon = Daemon::start_in(dir.path());
    let mut run = start_run(dir.path(), "go");
    let id = waiting_run(dir.path());
    let (code, stdout, stderr) = answer(dir.path(), "approve", &id, &["--always"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(wait_exit(&mut run).success());
    assert_eq!(calls(logs.path()), vec!["ran"; 3]);
    assert_eq!(events_of(dir.path(), "run.waiting").len(), 1, "asked once");
    let decisions: Vec<Value> = events_of(dir.path(), "run.approval")
        .into_iter()
        .map(|e| e["payload"]["decision"].clone())
        .collect();
    assert_eq!(
        decisions,
        vec![json!("allow"), json!("always"), json!("always")]
    );
}

#[test]
fn with_no_daemon_an_ask_is_a_denial_recorded_as_one() {
    let (dir, logs) = repo(1, "");
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "go"])
        .output()
        .unwrap();
    // The denial stopped what the agent tried: the run is `blocked` (exit 3).
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let fates = calls(logs.path());
    assert_eq!(fates.len(), 1);
    assert!(
        fates[0].contains("no one to ask: no daemon runs"),
        "{fates:?}"
    );
    let denied = events_of(dir.path(), "tool.denied");
    assert_eq!(denied.len(), 1, "{denied:?}");
    let p = &denied[0]["payload"];
    assert_eq!(p["by"], "approval");
    assert_eq!(p["tool"], "Bash");
    assert!(p["run_id"].as_str().unwrap().starts_with("run-"), "{p}");
    assert!(
        p["reason"].as_str().unwrap().starts_with("no one to ask: "),
        "{p}"
    );
}

#[test]
fn a_pending_approval_survives_a_daemon_restart() {
    let (dir, logs) = repo(1, "");
    let mut daemon = Daemon::start_in(dir.path());
    // A prompt too long for the control channel runs in `npc run`'s own
    // process, so the run outlives the daemon; its ask waits on the store.
    let prompt = "x".repeat(40 * 1024);
    let mut run = start_run(dir.path(), &prompt);
    let id = waiting_run(dir.path());
    assert!(daemon.terminate().success());
    // With no daemon, nothing can answer: `npc runs approve` says so.
    let (code, _, stderr) = answer(dir.path(), "approve", &id, &[]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no daemon runs"), "{stderr}");
    daemon.restart();
    assert_eq!(
        runs(dir.path())
            .into_iter()
            .find(|r| r["id"] == id.as_str())
            .unwrap()["state"],
        "waiting"
    );
    let (code, stdout, stderr) = answer(dir.path(), "approve", &id, &[]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(wait_exit(&mut run).success());
    assert_eq!(calls(logs.path()), vec!["ran".to_string()]);
}

/// What another account tries against a waiting run, from Python: the
/// control socket (`npc runs approve`'s way) and the API's approve.
const INTRUDER: &str = r#"
import json, socket, sys, urllib.request, urllib.error
control, api, run = sys.argv[1], sys.argv[2], sys.argv[3]
got = {}
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(control)
    s.sendall(json.dumps({"protocol": 2, "op": "approve_run", "id": run}).encode() + b"\n")
    got["control"] = s.recv(4096).decode() or "closed"
except OSError as e:
    got["control"] = type(e).__name__
req = urllib.request.Request("http://" + api + "/api/v1/runs/" + run + "/approve", data=b"{}",
    headers={"Content-Type": "application/json"})
try:
    got["api"] = urllib.request.urlopen(req, timeout=30).status
except urllib.error.HTTPError as e:
    got["api"] = e.code
print(json.dumps(got))
"#;

#[test]
fn another_account_cannot_answer_and_the_api_answers_the_owner() {
    use std::os::unix::fs::PermissionsExt as _;
    let can = nix::unistd::getuid().is_root()
        && Path::new("/usr/bin/python3").exists()
        && std::process::Command::new("setpriv")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    if !crate::support::require(crate::support::Peer::condition(
        "root, setpriv and the system python3 (to act as another account)",
        can,
        "run the suite as root, as CI does; apt-get install util-linux python3",
    )) {
        return;
    }
    let (dir, logs) = repo(1, "");
    let daemon = Daemon::start_in(dir.path());
    // A checkout others may read, as in a shared home directory.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let api = daemon.wait_event(0, "api.listening")["payload"]["url"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .to_string();
    let mut run = start_run(dir.path(), "go");
    let id = waiting_run(dir.path());
    let control = dir.path().join(".npc/daemon.sock");
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["/usr/bin/python3", "-c", INTRUDER])
        .args([control.to_str().unwrap(), &api, &id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["api"], 401, "{got}");
    let control_got = got["control"].as_str().unwrap();
    assert!(
        control_got == "PermissionError"
            || control_got == "closed"
            || control_got.contains("another uid")
            || control_got.contains("\"error\""),
        "{got}"
    );
    assert!(!control_got.contains("answered"), "{got}");
    // Nothing was answered: the run still waits, the tool has not run.
    assert_eq!(
        runs(dir.path())
            .into_iter()
            .find(|r| r["id"] == id.as_str())
            .unwrap()["state"],
        "waiting"
    );
    assert!(calls(logs.path()).is_empty());
    // The owner, with the repository's token, answers through the API.
    let token = std::fs::read_to_string(dir.path().join(".npc/api.token"))
        .unwrap()
        .trim()
        .to_string();
    // An answer naming a question the run never asked answers nothing.
    let unknown = http_post(
        &api,
        &format!("/api/v1/runs/{id}/approve"),
        &token,
        r#"{"approval_id": "nope"}"#,
    );
    assert_eq!(unknown["error"]["code"], "approval.not_found", "{unknown}");
    let waiting = wait_for("run.waiting", || events_of(dir.path(), "run.waiting").pop());
    let asked = waiting["payload"]["approval_id"].as_str().unwrap();
    let answered = http_post(
        &api,
        &format!("/api/v1/runs/{id}/approve"),
        &token,
        &json!({ "approval_id": asked }).to_string(),
    );
    assert_eq!(answered["state"], "allowed", "{answered}");
    assert_eq!(answered["approval_id"], asked, "{answered}");
    assert_eq!(answered["tool"], "Bash");
    assert!(wait_exit(&mut run).success());
    assert_eq!(calls(logs.path()), vec!["ran".to_string()]);
    // Again: 409, nothing waits.
    let again = http_post(&api, &format!("/api/v1/runs/{id}/approve"), &token, "");
    assert_eq!(again["error"]["code"], "run.finished", "{again}");
}

/// A POST to the API with the owner's token: the JSON answer.
fn http_post(api: &str, path: &str, token: &str, body: &str) -> Value {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(api).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|_| json!({ "raw": answer }))
}

/// A fleet repository (`[store] url`, the fleet's project and remote)
/// whose trigger `t` runs profile `dev` in place: its fake agent asks
/// about `Bash` once, logging the call's fate to `tool.log` in `logs`.
fn fleet_repo(logs: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let call = json!({"id": "c1", "name": "Bash", "arguments": {"command": "echo fleet"}});
    let manifest = format!(
        r#"
version = 1

[project]
name = "{project}"

[store]
url = "${{NPC_STORE_URL}}"

[daemon]
listen = "127.0.0.1:0"

# The sandboxed run writes its tool log outside the repository.
[runs.sandbox]
writable_outside = [{logs}]

[providers.fake]
kind = "claude_code"
command = {agent}
args = ["--provider", "claude_code", "--fixture", {fixture}]
env = {{ FAKE_AGENT_TOOL = {call}, FAKE_AGENT_TOOL_LOG = {log}, FAKE_AGENT_NPC = {npc}, NPC_STORE_URL = "${{NPC_STORE_URL}}" }}

[prompts.task]
template = "run the tool"

[profiles.dev]
provider = "fake"
description = "asks before Bash"
prompt = "task"
ask_tools = ["Bash"]
workspace = "in_place"

[triggers.t]
kind = "cron"
schedule = "24h"
action = {{ profile = "dev" }}
"#,
        project = crate::fleet::FLEET_PROJECT,
        agent = toml_str(
            &repo_root()
                .join("fixtures/clis/fake-agent.py")
                .display()
                .to_string()
        ),
        fixture = toml_str(
            &repo_root()
                .join("fixtures/clis")
                .join(FIXTURE)
                .display()
                .to_string()
        ),
        call = toml_str(&call.to_string()),
        log = toml_str(&tool_log(logs).display().to_string()),
        logs = toml_str(&logs.display().to_string()),
        npc = toml_str(&npc_path().display().to_string()),
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    crate::fleet::make_checkout(dir.path());
    dir
}

#[test]
fn in_a_fleet_another_nodes_api_answers_a_run_waiting_on_a_worker() {
    use npcagent::store::fleet::FleetQueue as _;
    let Some(cluster) = crate::pg::PgCluster::start() else {
        return;
    };
    let logs = tempfile::tempdir().unwrap();
    // Two machines of one fleet: a daemon in front (its API), a worker.
    let front = fleet_repo(logs.path());
    let back = fleet_repo(logs.path());
    let url = crate::fleet::worker_store(&cluster, front.path());
    let daemon = crate::fleet::ingress_daemon(front.path(), &url);
    wait_for("the daemon to join the fleet", || {
        let status = crate::fleet::npc_json(front.path(), &url, &["status"]);
        (status["store"]["state"] == "connected").then_some(())
    });
    let _worker = crate::support::Stopped::new(crate::fleet::start_worker_leased(
        back.path(),
        &url,
        &logs.path().join("worker.log"),
        crate::fleet::STEADY_LEASE_SECS,
    ));
    let fired = crate::fleet::npc_json(front.path(), &url, &["trigger", "fire", "t"]);
    let id = fired["run_id"].as_str().unwrap().to_string();
    let api = daemon.wait_event(0, "api.listening")["payload"]["url"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .to_string();
    let token = std::fs::read_to_string(front.path().join(".npc/api.token"))
        .unwrap()
        .trim()
        .to_string();
    // The fleet's listing says the run waits (not that it runs) once the
    // worker shared the parked call, and the front's API answers it.
    let state_listed = || {
        let listed = crate::fleet::npc_json(front.path(), &url, &["runs", "--fleet"]);
        listed
            .as_array()
            .and_then(|runs| runs.iter().find(|r| r["id"] == id.as_str()).cloned())
            .map(|r| r["state"].clone())
    };
    wait_for("the fleet's listing to show the run waiting", || {
        (state_listed() == Some(json!("waiting"))).then_some(())
    });
    let approve = format!("/api/v1/runs/{id}/approve");
    let answered = wait_for("the run parked on the worker to be answerable", || {
        let answer = http_post(&api, &approve, &token, "");
        (answer["state"] == "allowed").then_some(answer)
    });
    assert_eq!(answered["tool"], "Bash", "{answered}");
    assert!(calls(logs.path()).len() <= 1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt
        .block_on(npcagent::store::pg::PgStore::connect(
            &url,
            &crate::fleet::fleet_key(),
        ))
        .unwrap();
    wait_for("the worker to finish the run", || {
        rt.block_on(store.run(&id))
            .unwrap()
            .filter(|r| r.state == "succeeded")
    });
    assert_eq!(calls(logs.path()), vec!["ran".to_string()]);
    assert_eq!(state_listed(), Some(json!("succeeded")));
    // Its answer is in the fleet's log, relayed by the worker.
    let approval = wait_for("the relayed run.approval", || {
        rt.block_on(store.events_after(0, 10_000))
            .unwrap()
            .into_iter()
            .find(|e| e.kind == "run.approval" && e.payload["run_id"] == id.as_str())
    });
    assert_eq!(approval.payload["decision"], "allow");
    assert_eq!(approval.payload["by"], "api");
    // A second answer finds nothing waiting.
    let again = http_post(&api, &approve, &token, "");
    assert_eq!(again["error"]["code"], "run.finished", "{again}");
}

/// [`repo`] whose profile runs sandboxed (`workspace`), its tool log
/// writable outside the repository: the agent's `npc hook run` cannot
/// write the store, so it records and asks over the run's channel.
fn sandboxed_repo(times: u32, extra: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    let (dir, logs) = repo(times, extra);
    let path = dir.path().join("npcagent.toml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!(
        "sandbox = \"workspace\"\n\n[runs.sandbox]\nwritable_outside = [{}]\n",
        toml_str(&logs.path().display().to_string())
    ));
    std::fs::write(&path, text).unwrap();
    (dir, logs)
}

/// One request line on a run's channel socket: the answer line.
fn channel_request(socket: &Path, request: &Value) -> Value {
    use std::io::{BufRead, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    writeln!(stream, "{request}").unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stream)
        .read_line(&mut line)
        .unwrap();
    serde_json::from_str(&line).unwrap()
}

/// A sandboxed run's ask parks it through its channel (the daemon owns
/// the run and its store); a request on the channel with a wrong secret,
/// or naming another run, is refused and records nothing; `npc runs
/// approve` lets the call run.
#[test]
fn a_sandboxed_runs_ask_parks_it_over_its_channel_and_forged_requests_are_refused() {
    let (dir, logs) = sandboxed_repo(1, "");
    let _daemon = Daemon::start_in(dir.path());
    let mut run = start_run(dir.path(), "go");
    let id = waiting_run(dir.path());
    let waiting = wait_for("run.waiting", || events_of(dir.path(), "run.waiting").pop());
    assert_eq!(waiting["payload"]["run_id"], id.as_str());
    let socket = dir.path().join(".npc/runs").join(&id).join("npc.sock");
    let ask = json!({"kind": "ask", "request": {"hook": "forged", "reason": null,
        "tool_call": {"id": "f", "name": "Bash", "arguments": {}}}});
    let denied = json!({"kind": "record", "events": [{"kind": "tool.denied", "payload":
        {"run_id": "run-other", "tool": "Bash", "rule": "forged", "by": "hook"}}]});
    for (run_id, op) in [
        (id.as_str(), &ask),
        ("run-other", &denied),
        (id.as_str(), &denied),
    ] {
        let reply = channel_request(
            &socket,
            &json!({"protocol": 1, "run": run_id, "secret": "0".repeat(64), "op": op}),
        );
        assert_eq!(reply["reply"], "error", "{reply}");
        assert!(
            reply["error"]
                .as_str()
                .unwrap()
                .contains("not the run's own"),
            "{reply}"
        );
    }
    assert_eq!(events_of(dir.path(), "run.waiting").len(), 1);
    assert!(events_of(dir.path(), "tool.denied").is_empty());
    let (code, stdout, stderr) = answer(dir.path(), "approve", &id, &[]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(wait_exit(&mut run).success());
    assert_eq!(calls(logs.path()), vec!["ran".to_string()]);
    let row = runs(dir.path())
        .into_iter()
        .find(|r| r["id"] == id.as_str())
        .unwrap();
    assert_eq!(row["state"], "succeeded", "{row}");
}

/// A sandboxed run's hook denies a call (`denied_tools`): the denial, made
/// inside the sandbox, reaches the store over the run's channel (here
/// `npc run`'s own, no daemon) and the run ends `blocked`.
#[test]
fn a_sandboxed_runs_denial_is_recorded_over_its_channel_and_blocks_it() {
    let (dir, logs) = sandboxed_repo(1, "denied_tools = [\"Bash\"]\n");
    let out = npc()
        .current_dir(dir.path())
        .args(["run", "dev", "--prompt", "go"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let fates = calls(logs.path());
    assert_eq!(fates.len(), 1, "{fates:?}");
    assert!(fates[0].starts_with("denied: "), "{fates:?}");
    let denied = events_of(dir.path(), "tool.denied");
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(denied[0]["payload"]["tool"], "Bash");
    let run_id = denied[0]["payload"]["run_id"].as_str().unwrap().to_string();
    let row = runs(dir.path())
        .into_iter()
        .find(|r| r["id"] == run_id.as_str())
        .unwrap();
    assert_eq!(row["state"], "blocked", "{row}");
    // It ran sandboxed: its owner gave it a channel and a secret.
    let run_dir = dir.path().join(".npc/runs").join(&run_id);
    assert!(run_dir.join("run.secret").is_file());
    // The hook's own record came over the channel too.
    assert!(!events_of(dir.path(), "hook.call").is_empty());
}
