//! Worktree runs through the real binary and real git: each run in a git
//! worktree of its own, its result a branch, the main checkout untouched;
//! kept worktrees of failed runs, `npc runs clean`, a daemon killed
//! mid-run, concurrency keys, webhook filters and bad input.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::support::{Daemon, npc, repo_root, wait_for};

/// `git ARGS` in `dir`, which must succeed; its standard output.
pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=test", "-c", "user.email=test@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A git repository holding `manifest` and `files`, all committed.
pub(crate) fn repository(manifest: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["init", "--quiet", "--initial-branch=main"]);
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    git(dir.path(), &["add", "--all"]);
    git(dir.path(), &["commit", "--quiet", "-m", "start"]);
    dir
}

/// The run rows, newest first.
pub(crate) fn runs(dir: &Path) -> Vec<Value> {
    let out = npc()
        .current_dir(dir)
        .args(["runs", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `npc runs show ID --format json`.
pub(crate) fn show(dir: &Path, id: &str) -> Value {
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
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Wait until `n` runs have ended; their rows.
pub(crate) fn ended(dir: &Path, n: usize) -> Vec<Value> {
    wait_for(&format!("{n} runs to end"), || {
        let rows = runs(dir);
        let done: Vec<Value> = rows
            .into_iter()
            .filter(|r| !matches!(r["state"].as_str(), Some("queued" | "running")))
            .collect();
        (done.len() >= n).then_some(done)
    })
}

pub(crate) fn fire(dir: &Path, trigger: &str, payload: &str) -> String {
    let out = npc()
        .current_dir(dir)
        .args([
            "trigger",
            "fire",
            trigger,
            "--payload",
            payload,
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    answer["run_id"].as_str().unwrap().to_string()
}

const WRITER: &str = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[runs]
max_concurrent = 4
ports = "41000-41009"

[triggers.write]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
concurrency_key = "{{ payload.n }}"
copy = [".env"]
setup = ["cp .env from-setup.txt"]
action = { command = "sh", args = ["-c", "printf '%s' \"$NPC_TRIGGER_PAYLOAD\" > notes.txt; echo \"$NPC_PORT\" > port.txt; test \"$(pwd)\" = \"$NPC_WORKTREE\""] }
"#;

#[test]
fn four_runs_at_once_land_on_four_branches_and_the_checkout_stays_clean() {
    let dir = repository(WRITER, &[("notes.txt", "base\n"), (".gitignore", ".env\n")]);
    std::fs::write(dir.path().join(".env"), "SECRET=local\n").unwrap();
    let daemon = Daemon::start_in(dir.path());
    let ids: Vec<String> = (1..=4)
        .map(|n| fire(dir.path(), "write", &format!("{{\"n\":{n}}}")))
        .collect();
    let rows = ended(dir.path(), 4);
    assert!(rows.iter().all(|r| r["state"] == "succeeded"), "{rows:#?}");
    let mut ports = Vec::new();
    for (n, id) in (1..=4).zip(&ids) {
        let run = show(dir.path(), id);
        let result = &run["run"]["result"];
        let branch = result["branch"].as_str().unwrap();
        assert_eq!(branch, format!("npc/{id}"));
        assert_eq!(result["files"], 3, "{result}");
        // Each branch has its own content, on top of the base commit.
        let notes = git(dir.path(), &["show", &format!("{branch}:notes.txt")]);
        assert!(notes.contains(&format!("\"n\":{n}")), "{notes}");
        assert_eq!(
            git(dir.path(), &["show", &format!("{branch}:from-setup.txt")]),
            "SECRET=local\n"
        );
        ports.push(git(dir.path(), &["show", &format!("{branch}:port.txt")]));
        let base = git(dir.path(), &["rev-parse", "main"]);
        assert_eq!(result["base"].as_str().unwrap(), base.trim());
        let message = git(dir.path(), &["log", "-1", "--format=%B", branch]);
        assert!(message.contains(&format!("Npc-Run: {id}")), "{message}");
        let finished = run["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "run.finished")
            .unwrap();
        assert_eq!(finished["payload"]["result"]["branch"], branch);
        // A succeeded run's worktree is removed; its branch stays.
        assert!(run["run"]["worktree"].is_null(), "{run}");
    }
    // Runs of different keys ran side by side, each with its own port.
    ports.sort();
    ports.dedup();
    assert!(
        ports.iter().all(|p| p.trim().starts_with("4100")),
        "{ports:?}"
    );
    // The main checkout: its files, index and branch untouched.
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "base\n"
    );
    assert_eq!(
        git(dir.path(), &["branch", "--show-current"]).trim(),
        "main"
    );
    let worktrees = git(dir.path(), &["worktree", "list", "--porcelain"]);
    assert_eq!(worktrees.matches("worktree ").count(), 1, "{worktrees}");
    // `npc runs diff` prints the run's patch.
    let out = npc()
        .current_dir(dir.path())
        .args(["runs", "diff", &ids[0]])
        .output()
        .unwrap();
    let patch = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        patch.contains("+{\"trigger\":\"write\",\"kind\":\"manual\""),
        "{patch}"
    ); // The API shows the result, and the patch behind the dashboard's link.
    let api = crate::api::api_addr(&daemon);
    let run = crate::api::http(&api, "GET", &format!("/api/v1/runs/{}", ids[0]), &[]);
    assert_eq!(run.status, 200);
    assert_eq!(run.json()["result"]["branch"], format!("npc/{}", ids[0]));
    let diff = crate::api::http(&api, "GET", &format!("/api/v1/runs/{}/diff", ids[0]), &[]);
    assert_eq!(diff.status, 200);
    let diff = diff.json();
    assert_eq!(diff["patch"].as_str().unwrap(), patch.as_ref());
    assert_eq!(diff["truncated"], false);
}

const PUSHING: &str = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.ship]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
push = true
action = { command = "sh", args = ["-c", "echo shipped > shipped.txt"] }

[triggers.refused]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
push = true
branch = "refused/{{ run.id }}"
after = ["echo \"$NPC_RUN_PUSHED\" > \"$NPC_REPO_ROOT/.npc/pushed.txt\""]
action = { command = "sh", args = ["-c", "echo refused > refused.txt"] }

[triggers.unchanged]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
push = true
action = { command = "true" }

[triggers.broken]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
push = true
action = { command = "sh", args = ["-c", "echo half > half.txt; exit 3"] }
"#;

#[test]
fn push_sends_a_succeeded_runs_branch_to_origin_and_a_refused_push_keeps_the_outcome() {
    let dir = repository(PUSHING, &[("notes.txt", "base\n")]);
    let origin = tempfile::tempdir().unwrap();
    git(origin.path(), &["init", "--quiet", "--bare"]);
    let hook = origin.path().join("hooks/pre-receive");
    std::fs::write(
        &hook,
        "#!/bin/sh\nwhile read o n ref; do case \"$ref\" in refs/heads/refused/*) echo no >&2; exit 1;; esac; done\n",
    )
    .unwrap();
    let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&hook, executable).unwrap();
    let url = origin.path().display().to_string();
    git(dir.path(), &["remote", "add", "origin", &url]);
    let _daemon = Daemon::start_in(dir.path());
    let ids: Vec<String> = ["ship", "refused", "unchanged", "broken"]
        .iter()
        .map(|t| fire(dir.path(), t, "{}"))
        .collect();
    ended(dir.path(), 4);
    let in_origin = |branch: &str| {
        Command::new("git")
            .args([
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/{branch}"),
            ])
            .current_dir(origin.path())
            .output()
            .unwrap()
            .status
            .success()
    };
    // Pushed: the branch is in origin, the result says so.
    let run = show(dir.path(), &ids[0]);
    assert_eq!(run["run"]["state"], "succeeded", "{run}");
    let result = &run["run"]["result"];
    assert_eq!(result["push"]["ok"], true, "{result}");
    assert_eq!(result["push"]["remote"], url.as_str());
    let branch = format!("npc/{}", ids[0]);
    assert_eq!(
        git(origin.path(), &["rev-parse", &branch]).trim(),
        result["head"].as_str().unwrap()
    );
    assert!(
        run["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "run.pushed")
    );
    // Refused by origin: recorded, the run still succeeded, `after` knew.
    let run = show(dir.path(), &ids[1]);
    assert_eq!(run["run"]["state"], "succeeded", "{run}");
    let push = &run["run"]["result"]["push"];
    assert_eq!(push["ok"], false, "{push}");
    assert!(
        push["error"].as_str().unwrap().contains("git push"),
        "{push}"
    );
    assert!(
        run["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "run.push_failed")
    );
    assert!(!in_origin(&format!("refused/{}", ids[1])));
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".npc/pushed.txt")).unwrap(),
        "false\n"
    );
    // Nothing changed, or the run failed: nothing pushed.
    let run = show(dir.path(), &ids[2]);
    assert_eq!(run["run"]["state"], "succeeded", "{run}");
    assert!(run["run"]["result"]["push"].is_null(), "{run}");
    assert!(!in_origin(&format!("npc/{}", ids[2])));
    let run = show(dir.path(), &ids[3]);
    assert_eq!(run["run"]["state"], "failed", "{run}");
    assert!(!in_origin(&format!("npc/{}", ids[3])));
    // The checkout is untouched.
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), "");
}

const FAILING: &str = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.fail]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
after = ["echo \"$NPC_RUN_STATUS $NPC_RUN_BRANCH\" > \"$NPC_REPO_ROOT/.npc/after.txt\""]
action = { command = "sh", args = ["-c", "echo half > work.txt; exit 3"] }
"#;

#[test]
fn a_failed_run_keeps_its_worktree_until_it_is_cleaned_and_its_branch_after() {
    let dir = repository(FAILING, &[("notes.txt", "base\n")]);
    let _daemon = Daemon::start_in(dir.path());
    let id = fire(dir.path(), "fail", "{}");
    let rows = ended(dir.path(), 1);
    assert_eq!(rows[0]["state"], "failed");
    let run = show(dir.path(), &id);
    let kept = run["run"]["worktree"].as_str().unwrap().to_string();
    assert!(Path::new(&kept).join("work.txt").is_file(), "{run}");
    // The partial work is on the run's branch, and `after` saw the outcome.
    let branch = format!("npc/{id}");
    assert_eq!(
        git(dir.path(), &["show", &format!("{branch}:work.txt")]),
        "half\n"
    );
    let after = wait_for("the after command", || {
        std::fs::read_to_string(dir.path().join(".npc/after.txt")).ok()
    });
    assert_eq!(after.trim(), format!("failed {branch}"));
    let human = npc()
        .current_dir(dir.path())
        .args(["runs", "show", &id])
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("worktree kept"), "{human}");
    // Not yet past `keep_failed`: a plain clean keeps it; `--all` removes it.
    let out = npc()
        .current_dir(dir.path())
        .args(["runs", "clean", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["removed"],
        serde_json::json!([])
    );
    let out = npc()
        .current_dir(dir.path())
        .args(["runs", "clean", "--all", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["removed"],
        serde_json::json!([id])
    );
    assert!(!Path::new(&kept).exists());
    assert!(git(dir.path(), &["branch", "--list", &branch]).contains(&branch));
    let worktrees = git(dir.path(), &["worktree", "list", "--porcelain"]);
    assert_eq!(worktrees.matches("worktree ").count(), 1, "{worktrees}");
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), "");
}

const SLOW: &str = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.slow]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
action = { command = "sh", args = ["-c", "echo started > started.txt; exec sleep 600"] }
"#;

#[test]
fn a_daemon_killed_mid_run_leaves_an_interrupted_run_and_a_kept_worktree() {
    let dir = repository(SLOW, &[("notes.txt", "base\n")]);
    let mut daemon = Daemon::start_in(dir.path());
    let id = fire(dir.path(), "slow", "{}");
    let worktree = dir.path().join(".npc/worktrees").join(&id);
    wait_for("the run to start in its worktree", || {
        worktree.join("started.txt").is_file().then_some(())
    });
    daemon.kill();
    daemon.restart();
    let rows = ended(dir.path(), 1);
    assert_eq!(rows[0]["state"], "interrupted", "{rows:#?}");
    // Kept for inspection (within `keep_failed`), and known to git.
    assert!(worktree.is_dir());
    assert!(git(dir.path(), &["worktree", "list"]).contains(&id));
    let out = npc()
        .current_dir(dir.path())
        .args(["runs", "clean", "--all"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!worktree.exists());
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), "");
}

#[test]
fn a_profile_run_edits_a_file_and_the_change_is_on_its_branch() {
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let fixture = repo_root().join("fixtures/clis/claude_code/2.1.197/tool_call.jsonl");
    let manifest = format!(
        r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[providers.fake]
kind = "claude_code"
command = {agent:?}
args = ["--provider", "claude_code", "--fixture", {fixture:?}]
env = {{ FAKE_AGENT_WRITE = "edited.txt=by the agent" }}

[prompts.task]
template = "edit a file"

[profiles.dev]
provider = "fake"
description = "development"
prompt = "task"

[triggers.agent]
kind = "cron"
schedule = "@yearly"
action = {{ profile = "dev" }}
"#,
        agent = agent.display().to_string(),
        fixture = fixture.display().to_string(),
    );
    let dir = repository(&manifest, &[("notes.txt", "base\n")]);
    // A profile run the daemon starts unattended in a git repository gets a
    // worktree by default; `npc validate` says so.
    let out = npc()
        .current_dir(dir.path())
        .arg("validate")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("trigger `agent` runs in a worktree"),
        "{said}"
    );
    let _daemon = Daemon::start_in(dir.path());
    let id = fire(dir.path(), "agent", "{}");
    let rows = ended(dir.path(), 1);
    assert_eq!(rows[0]["state"], "succeeded", "{rows:#?}");
    let branch = format!("npc/{id}");
    assert_eq!(
        git(dir.path(), &["show", &format!("{branch}:edited.txt")]),
        "by the agent"
    );
    assert!(!dir.path().join("edited.txt").exists());
    // The checkout is as it was, but for the subagent file the daemon
    // writes for the profile (`.claude/agents/dev.md`).
    assert_eq!(
        git(
            dir.path(),
            &["status", "--porcelain", "--", ".", ":!.claude"]
        ),
        ""
    );
    assert!(dir.path().join(".claude/agents/dev.md").is_file());
}

#[test]
fn runs_of_one_key_queue_while_other_keys_run_beside_them() {
    let manifest = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.pr]
kind = "cron"
schedule = "@yearly"
overlap = "skip"
concurrency_key = "{{ payload.pr }}"
action = { command = "sh", args = ["-c", """
case "$NPC_TRIGGER_PAYLOAD" in
  *'"pr":1'*) i=0; until [ -e pr2.done ] || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done; test -e pr2.done ;;
  *) touch pr2.done ;;
esac
"""] }
"#;
    let dir = repository(manifest, &[]);
    let _daemon = Daemon::start_in(dir.path());
    // PR 1's run lasts until PR 2's has run, so it is still going when PR 1
    // fires again (that firing is skipped), and it ends only if PR 2 (a key
    // of its own) runs beside it.
    fire(dir.path(), "pr", "{\"pr\":1}");
    fire(dir.path(), "pr", "{\"pr\":1}");
    fire(dir.path(), "pr", "{\"pr\":2}");
    let rows = ended(dir.path(), 3);
    let mut states: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            let run = show(dir.path(), r["id"].as_str().unwrap());
            (
                run["run"]["concurrency_key"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                r["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    states.sort();
    assert_eq!(
        states,
        [
            ("1".to_string(), "skipped".to_string()),
            ("1".to_string(), "succeeded".to_string()),
            ("2".to_string(), "succeeded".to_string())
        ]
    );
}

#[test]
fn bad_worktree_settings_are_clear_errors_and_lose_nothing() {
    // Not a git repository: an error of `npc validate`, at the setting.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[triggers.t]\nkind = \"cron\"\nschedule = \"@yearly\"\nworkspace = \"worktree\"\ncopy = [\"../outside\"]\naction = { command = \"true\" }\n\
         [triggers.p]\nkind = \"cron\"\nschedule = \"@yearly\"\nworkspace = \"in_place\"\npush = true\naction = { command = \"true\" }\n",
    )
    .unwrap();
    let out = npc()
        .current_dir(dir.path())
        .arg("validate")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("needs a git repository"), "{said}");
    assert!(said.contains("`copy` path leaves the repository"), "{said}");
    assert!(
        said.contains("`push` needs `workspace = \"worktree\"`"),
        "{said}"
    );
    // A worktrees directory that is the checkout itself or git's own.
    for bad in [".", ".git/wt"] {
        std::fs::write(
            dir.path().join("npcagent.toml"),
            format!("version = 1\n[runs]\nworktrees_dir = \"{bad}\"\n"),
        )
        .unwrap();
        let out = npc()
            .current_dir(dir.path())
            .arg("validate")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{bad}: {said}");
        assert!(said.contains("is not a directory of its own"), "{said}");
    }

    // A ref that names nothing, a branch that exists, an invalid branch
    // name: each fails its run with the reason; the checkout is untouched.
    let manifest = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.noref]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
ref = "{{ payload.sha }}"
action = { command = "true" }

[triggers.taken]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
branch = "main"
action = { command = "true" }

[triggers.badname]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
branch = "{{ payload.name }}"
action = { command = "true" }

[triggers.hangs]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
timeout = "2s"
setup = ["sleep 600"]
action = { command = "true" }

[triggers.linked]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
copy = ["secret.txt"]
action = { command = "true" }
"#;
    let dir = repository(manifest, &[("notes.txt", "base\n")]);
    // `copy` of a link to a file outside the repository.
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(outside.path(), "not yours").unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("secret.txt")).unwrap();
    std::fs::write(dir.path().join(".git/info/exclude"), "secret.txt\n").unwrap();
    let _daemon = Daemon::start_in(dir.path());
    let cases = [
        (
            "noref",
            "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\"}",
            "names no commit",
        ),
        ("taken", "{}", "branch `main` exists already"),
        (
            "badname",
            "{\"name\":\"--upload-pack=evil\"}",
            "starts with `-`",
        ),
        ("hangs", "{}", "timed out"),
        ("linked", "{}", "cannot copy `secret.txt`"),
    ];
    for (n, (trigger, payload, reason)) in cases.iter().enumerate() {
        let id = fire(dir.path(), trigger, payload);
        let rows = ended(dir.path(), n + 1);
        let row = rows.iter().find(|r| r["id"] == id.as_str()).unwrap();
        assert_eq!(row["state"], "failed", "{row}");
        let detail = row["detail"].as_str().unwrap_or("");
        assert!(detail.contains(reason), "{trigger}: {detail}");
    }
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), "");
    assert_eq!(
        git(dir.path(), &["branch", "--show-current"]).trim(),
        "main"
    ); // Nothing of the linked file reached a worktree.
    let kept = dir.path().join(".npc/worktrees");
    for entry in std::fs::read_dir(&kept).unwrap() {
        assert!(!entry.unwrap().path().join("secret.txt").exists());
    }
}

#[test]
fn a_worktrees_directory_that_is_a_link_is_refused_and_nothing_lands_behind_it() {
    let manifest = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.t]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
action = { command = "true" }
"#;
    let dir = repository(manifest, &[("notes.txt", "base\n")]);
    let elsewhere = tempfile::tempdir().unwrap();
    crate::support::npc_made_state_dir(dir.path());
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(".npc/worktrees")).unwrap();
    let _daemon = Daemon::start_in(dir.path());
    let id = fire(dir.path(), "t", "{}");
    let rows = ended(dir.path(), 1);
    assert_eq!(rows[0]["state"], "failed");
    let detail = rows[0]["detail"].as_str().unwrap_or("");
    assert!(detail.contains("worktrees directory"), "{detail}");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    assert!(!git(dir.path(), &["worktree", "list"]).contains(&id));
}

#[test]
fn a_worktrees_directory_in_the_checkout_is_ignored_by_git_and_by_file_watch_triggers() {
    let manifest = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[runs]
worktrees_dir = "wt"

[triggers.write]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
action = { command = "sh", args = ["-c", "echo x > out.txt; exit 1"] }

[triggers.watch]
kind = "file_watch"
paths = ["**/*.txt"]
debounce_ms = 100
action = { command = "true" }
"#;
    let dir = repository(manifest, &[]);
    let _daemon = Daemon::start_in(dir.path());
    let id = fire(dir.path(), "write", "{}");
    let rows = ended(dir.path(), 1);
    assert_eq!(rows[0]["state"], "failed");
    // Kept (it failed) in `wt/`, which git does not show.
    assert!(dir.path().join("wt").join(&id).join("out.txt").is_file());
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), "");
    // A write in the checkout fires the watch; the run's write before it did not.
    std::fs::write(dir.path().join("touched.txt"), "x").unwrap();
    let rows = ended(dir.path(), 2);
    let watched: Vec<&Value> = rows.iter().filter(|r| r["trigger"] == "watch").collect();
    assert_eq!(watched.len(), 1, "{rows:#?}");
    let run = show(dir.path(), watched[0]["id"].as_str().unwrap());
    let payload = &run["run"]["payload"];
    assert_eq!(payload["path"], "touched.txt", "{payload}");
}

/// A manifest whose Claude Code profile (the fake agent) changes nothing,
/// run by trigger `plain` and by trigger `expecting` (`expect_changes`).
fn unchanging(extra_env: &str) -> String {
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let fixture = repo_root().join("fixtures/clis/claude_code/2.1.197/tool_call.jsonl");
    format!(
        r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[providers.fake]
kind = "claude_code"
command = {agent:?}
args = ["--provider", "claude_code", "--fixture", {fixture:?}]
env = {{ {extra_env} }}

[prompts.task]
template = "look, change nothing"

[profiles.dev]
provider = "fake"
description = "development"
prompt = "task"

[triggers.plain]
kind = "cron"
schedule = "@yearly"
action = {{ profile = "dev" }}

[triggers.expecting]
kind = "cron"
schedule = "@yearly"
expect_changes = true
action = {{ profile = "dev" }}
"#,
        agent = agent.display().to_string(),
        fixture = fixture.display().to_string(),
    )
}

/// A worktree run that changed nothing says so in its result; with
/// `expect_changes = true` it fails with that reason.
#[test]
fn a_run_that_changed_nothing_says_so_and_fails_when_changes_are_expected() {
    let dir = repository(&unchanging(""), &[("notes.txt", "base\n")]);
    let daemon = Daemon::start_in(dir.path());
    let plain = fire(dir.path(), "plain", "{}");
    ended(dir.path(), 1);
    let expecting = fire(dir.path(), "expecting", "{}");
    let rows = ended(dir.path(), 2);
    let row = |id: &str| rows.iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(row(&plain)["state"], "succeeded", "{rows:#?}");
    assert_eq!(row(&expecting)["state"], "failed", "{rows:#?}");
    assert!(
        row(&expecting)["detail"]
            .as_str()
            .unwrap()
            .starts_with("no changes"),
        "{rows:#?}"
    );
    let finished = |id: &str| {
        daemon
            .events()
            .into_iter()
            .find(|e| e["kind"] == "run.finished" && e["payload"]["run_id"] == id)
            .unwrap()
    };
    let plain_end = finished(&plain);
    assert_eq!(
        plain_end["payload"]["result"]["unchanged"], true,
        "{plain_end}"
    );
    assert_eq!(plain_end["payload"]["result"]["files"], 0, "{plain_end}");
    let expecting_end = finished(&expecting);
    assert_eq!(expecting_end["payload"]["outcome"], "failed");
    assert_eq!(expecting_end["payload"]["reason"], "no_changes");
    // `npc runs show` says it in words.
    let out = npc()
        .current_dir(dir.path())
        .args(["runs", "show", &plain])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("no changes, the run changed no file"),
        "{said}"
    );
    // The manifest field is validated: in place has nothing to measure.
    let bad = unchanging("").replace(
        "expect_changes = true",
        "expect_changes = true\nworkspace = \"in_place\"",
    );
    std::fs::write(dir.path().join("npcagent.toml"), bad).unwrap();
    let out = npc()
        .current_dir(dir.path())
        .arg("validate")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("`expect_changes` needs `workspace = \"worktree\"`"),
        "{said}"
    );
}

/// Claude Code trusts a worktree through its repository and ignores the
/// worktree's `.claude/settings.json` when the repository is untrusted: the
/// run fails at once (`untrusted`, the agent never started) with the exact
/// fix, npc writing nothing of the user's; once the user trusted the
/// repository the run goes on. A worktree without such settings needs no trust.
#[test]
fn a_claude_worktree_run_needs_its_repository_trusted_or_fails_untrusted() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join(".claude.json");
    std::fs::write(&config, r#"{"numStartups": 7, "projects": {}}"#).unwrap();
    let dir = repository(
        &unchanging(""),
        &[("notes.txt", "base\n"), (".claude/settings.json", "{}")],
    );
    let root = dir.path().canonicalize().unwrap();
    let path = std::env::var("PATH").unwrap();
    let home_text = home.path().to_string_lossy().into_owned();
    let data = home.path().join("data").to_string_lossy().into_owned();
    let env = [
        ("PATH", path.as_str()),
        ("HOME", home_text.as_str()),
        ("XDG_DATA_HOME", data.as_str()),
    ];
    let daemon = Daemon::start_in_with(
        dir.path(),
        crate::support::DaemonSetup {
            only_env: Some(&env),
            ..Default::default()
        },
    );
    let first = fire(dir.path(), "plain", "{}");
    let rows = ended(dir.path(), 1);
    assert_eq!(rows[0]["state"], "failed", "{rows:#?}");
    let detail = rows[0]["detail"].as_str().unwrap();
    assert!(detail.contains("does not trust"), "{detail}");
    let fix = format!("projects[\"{}\"].hasTrustDialogAccepted", root.display());
    assert!(detail.contains(&fix), "{detail}");
    let events = daemon.events();
    let end = events
        .iter()
        .find(|e| e["kind"] == "run.finished" && e["payload"]["run_id"] == first.as_str())
        .unwrap();
    assert_eq!(end["payload"]["reason"], "untrusted", "{end}");
    assert!(
        !events
            .iter()
            .any(|e| e["payload"]["run_id"] == first.as_str()
                && e["kind"].as_str().is_some_and(|k| k.starts_with("agent."))),
        "the agent started: {events:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        r#"{"numStartups": 7, "projects": {}}"#
    );

    // The fix, as Claude Code's trust dialog stores it.
    let trusted = serde_json::json!({ "numStartups": 7, "projects": { root.to_string_lossy(): { "hasTrustDialogAccepted": true } } });
    std::fs::write(&config, trusted.to_string()).unwrap();
    let second = fire(dir.path(), "plain", "{}");
    let rows = ended(dir.path(), 2);
    let row = rows.iter().find(|r| r["id"] == second.as_str()).unwrap();
    assert_eq!(row["state"], "succeeded", "{rows:#?}");
}
