//! The code at the commit, through the real binary, real git and a real
//! PostgreSQL: an ingress daemon records on each run the repository's
//! remote and the commit it starts from; a worker whose checkout is behind
//! fetches that commit into its mirror and runs there, `push = true` sends
//! the result branch to the remote (a refused push is recorded, the run's
//! outcome kept), an `in_place` run works in the worker's own checkout, and
//! rows naming another remote or no object id fail before git sees them.

use std::path::Path;
use std::process::Command;

use npcagent::store::fleet::FleetQueue;
use npcagent::store::pg::PgStore;
use npcagent::store::queue::{NewRun, RunCode, RunRow, state};
use serde_json::{Value, json};

use crate::fleet::{
    STEADY_LEASE_SECS, ingress_daemon, npc_json, start_worker_leased, worker_store,
};
use crate::pg::PgCluster;
use crate::support::{Stopped, wait_for};

/// The project, and so the fleet's name before `@`.
const PROJECT: &str = "fleet-code";

/// The manifest both checkouts hold: `build` reads a file only the newest
/// commit has and pushes its branch; `refused` pushes a branch origin's
/// hook refuses; `pinned` starts from the ref its payload names; `here`
/// works in place.
const MANIFEST: &str = r#"version = 1
[project]
name = "fleet-code"
[store]
url = "${NPC_STORE_URL}"
[runs]
max_concurrent = 2

[triggers.build]
kind = "cron"
schedule = "24h"
workspace = "worktree"
push = true
action = { command = "sh", args = ["-c", "cat new.txt > seen.txt"] }

[triggers.refused]
kind = "cron"
schedule = "24h"
workspace = "worktree"
push = true
branch = "refused/{{ run.id }}"
after = ["echo \"$NPC_RUN_PUSHED\" > \"$NPC_REPO_ROOT/pushed.txt\""]
action = { command = "sh", args = ["-c", "echo changed > changed.txt"] }

[triggers.pinned]
kind = "cron"
schedule = "24h"
workspace = "worktree"
ref = "{{ payload.sha }}"
action = { command = "true" }

[triggers.here]
kind = "cron"
schedule = "24h"
workspace = "in_place"
action = { command = "sh", args = ["-c", "pwd > here.txt"] }
"#;

/// Origin's hook: branches under `refused/` are not taken.
const PRE_RECEIVE: &str = "#!/bin/sh\nwhile read old new ref; do\n  case \"$ref\" in refs/heads/refused/*) echo \"refused by policy\" >&2; exit 1;; esac\ndone\n";

/// `git ARGS` in `dir`, which must succeed; its standard output, trimmed.
fn git(dir: &Path, args: &[&str]) -> String {
    crate::worktrees::git(dir, args).trim().to_string()
}

/// Whether `git ARGS` in `dir` succeeds.
fn git_ok(dir: &Path, args: &[&str]) -> bool {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
        .status
        .success()
}

/// Commit everything in `dir` as `message`; the new commit.
pub(crate) fn commit(dir: &Path, message: &str) -> String {
    git(dir, &["add", "--all"]);
    git(dir, &["commit", "--quiet", "-m", message]);
    git(dir, &["rev-parse", "HEAD"])
}

/// Run `id` of the fleet once it ended.
pub(crate) fn ended(rt: &tokio::runtime::Runtime, store: &PgStore, id: &str) -> RunRow {
    wait_for(&format!("run `{id}` to end"), || {
        rt.block_on(store.run(id))
            .unwrap()
            .filter(|r| !matches!(r.state.as_str(), state::QUEUED | state::RUNNING))
    })
}

/// The fleet's events of run `id`.
pub(crate) fn events_of(
    rt: &tokio::runtime::Runtime,
    store: &PgStore,
    id: &str,
) -> Vec<(String, Value)> {
    rt.block_on(store.events_after(0, 10_000))
        .unwrap()
        .into_iter()
        .filter(|e| e.payload["run_id"] == id)
        .map(|e| (e.kind, e.payload))
        .collect()
}

/// A run of `build` the ingress did not queue: `code` as another machine wrote it.
fn forged(code: RunCode) -> NewRun {
    NewRun {
        max_queued: 100,
        code: Some(code),
        ..NewRun::new(
            npcagent::runs::new_run_id(),
            "build",
            npcagent::model::RunOrigin::Cron,
            "{}",
        )
    }
}

#[test]
fn a_worker_behind_its_remote_runs_the_commit_its_ingress_queued_and_pushes_the_result() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let top = tempfile::tempdir().unwrap();
    let top = top.path().canonicalize().unwrap();
    let origin = top.join("origin.git");
    let remote = origin.display().to_string();
    std::fs::create_dir(&origin).unwrap();
    git(
        &origin,
        &["init", "--quiet", "--bare", "--initial-branch=main"],
    );
    let hook = origin.join("hooks/pre-receive");
    std::fs::write(&hook, PRE_RECEIVE).unwrap();
    let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&hook, executable).unwrap();
    // The ingress's checkout writes the first commit; the worker's is
    // cloned then, before the second.
    let ingress = top.join("ingress");
    git(&top, &["clone", "--quiet", &remote, "ingress"]);
    git(&ingress, &["symbolic-ref", "HEAD", "refs/heads/main"]);
    std::fs::write(ingress.join("npcagent.toml"), MANIFEST).unwrap();
    let first = commit(&ingress, "start");
    git(&ingress, &["push", "--quiet", "origin", "main"]);
    git(&top, &["clone", "--quiet", &remote, "worker"]);
    let worker = top.join("worker");
    std::fs::write(ingress.join("new.txt"), "only in the new commit\n").unwrap();
    let second = commit(&ingress, "new");
    git(&ingress, &["push", "--quiet", "origin", "main"]);
    assert_eq!(git(&worker, &["rev-parse", "HEAD"]), first);
    // Another repository, with a commit origin never had.
    let evil = top.join("evil.git");
    std::fs::create_dir(&evil).unwrap();
    git(&evil, &["init", "--quiet", "--bare"]);
    let evil_src = top.join("evil-src");
    git(&top, &["init", "--quiet", "evil-src"]);
    std::fs::write(evil_src.join("evil.txt"), "evil\n").unwrap();
    let evil_commit = commit(&evil_src, "evil");
    git(
        &evil_src,
        &[
            "push",
            "--quiet",
            &evil.display().to_string(),
            "HEAD:refs/heads/x",
        ],
    );

    let url = worker_store(&cluster, &ingress);
    let daemon = ingress_daemon(&ingress, &url);
    wait_for("the ingress to join the fleet", || {
        let status = npc_json(&ingress, &url, &["status"]);
        (status["store"]["state"] == "connected").then_some(())
    });
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("worker.log");
    let _worker = Stopped::new(start_worker_leased(&worker, &url, &log, STEADY_LEASE_SECS));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fleet = format!("{PROJECT}@{remote}");
    let store = rt.block_on(PgStore::connect(&url, &fleet)).unwrap();
    let fire_with = |trigger: &str, payload: &str| {
        let args = ["trigger", "fire", trigger, "--payload", payload];
        let answer = npc_json(&ingress, &url, &args);
        let id = answer["run_id"].as_str();
        id.unwrap_or_else(|| panic!("{answer}\n{}", daemon.log()))
            .to_string()
    };
    let fire = |trigger: &str| fire_with(trigger, "{}");
    let why = || {
        format!(
            "{}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default(),
            daemon.log()
        )
    };

    // The row names the remote and the ingress's HEAD; the worker fetches
    // it into its mirror and the run sees the new file.
    let id = fire("build");
    let row = rt.block_on(store.run(&id)).unwrap().expect("the row");
    assert_eq!(
        row.code,
        Some(RunCode {
            remote: remote.clone(),
            commit: Some(second.clone()),
        })
    );
    let row = ended(&rt, &store, &id);
    assert_eq!(row.state, state::SUCCEEDED, "{row:?}\n{}", why());
    let events = events_of(&rt, &store, &id);
    let of = |kind: &str| {
        events
            .iter()
            .find(|(k, _)| k == kind)
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| panic!("no `{kind}` in {events:?}"))
    };
    assert_eq!(of("run.workspace")["base"], second.as_str());
    let result = &of("run.finished")["result"];
    assert_eq!(result["base"], second.as_str(), "{result}");
    // The shared row carries it too (`npc runs --fleet` shows the branch),
    // with the push that came after the run's end.
    let shared = row.result.clone().unwrap_or_default();
    assert_eq!(
        (&shared["branch"], &shared["head"], &shared["push"]["ok"]),
        (&result["branch"], &result["head"], &json!(true)),
        "{row:?}"
    );
    let branch = format!("npc/{id}");
    assert_eq!(result["branch"], branch.as_str());
    assert_eq!(of("run.pushed")["remote"], remote.as_str());
    // The result branch is in origin, based on the new commit.
    let pushed = format!("refs/heads/{branch}");
    assert_eq!(
        git(&origin, &["rev-parse", &pushed]),
        result["head"].as_str().unwrap()
    );
    assert_eq!(git(&origin, &["rev-parse", &format!("{pushed}^")]), second);
    assert_eq!(
        git(&origin, &["show", &format!("{pushed}:seen.txt")]),
        "only in the new commit"
    );
    // The worker's checkout is where it was; its mirror holds the commit.
    assert_eq!(git(&worker, &["rev-parse", "HEAD"]), first);
    assert!(!worker.join("new.txt").exists());
    let mirror = worker.join(".npc").join(npcagent::runs::mirror::MIRROR_DIR);
    assert!(git_ok(&mirror, &["cat-file", "-e", &second]));

    // A refused push: recorded, and the run keeps its outcome.
    let id = fire("refused");
    let row = ended(&rt, &store, &id);
    assert_eq!(row.state, state::SUCCEEDED, "{row:?}\n{}", why());
    let events = events_of(&rt, &store, &id);
    let failed = events
        .iter()
        .find(|(k, _)| k == "run.push_failed")
        .map(|(_, p)| p.clone())
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(failed["remote"], remote.as_str());
    assert!(
        failed["error"].as_str().unwrap().contains("git push"),
        "{failed}"
    );
    assert!(!git_ok(
        &origin,
        &["rev-parse", "--verify", &format!("refs/heads/refused/{id}")]
    ));
    assert_eq!(
        std::fs::read_to_string(worker.join("pushed.txt")).unwrap(),
        "false\n"
    );

    // A commit id in the payload is taken as it is; a ref the ingress
    // cannot resolve fails the run, saying so.
    let id = fire_with("pinned", &format!("{{\"sha\":\"{first}\"}}"));
    let row = ended(&rt, &store, &id);
    assert_eq!(row.state, state::SUCCEEDED, "{row:?}\n{}", why());
    let base = events_of(&rt, &store, &id)
        .into_iter()
        .find(|(k, _)| k == "run.workspace")
        .map(|(_, p)| p["base"].clone());
    assert_eq!(base, Some(Value::from(first.as_str())));
    let id = fire_with("pinned", "{\"sha\":\"no-such-branch\"}");
    let row = ended(&rt, &store, &id);
    assert_eq!(row.state, state::FAILED, "{row:?}");
    let detail = row.detail.unwrap_or_default();
    assert!(
        detail.contains("could not resolve `ref` `no-such-branch`"),
        "{detail}"
    );

    // In place: the worker's own checkout.
    let id = fire("here");
    let row = ended(&rt, &store, &id);
    assert_eq!(row.state, state::SUCCEEDED, "{row:?}\n{}", why());
    let here = std::fs::read_to_string(worker.join("here.txt")).unwrap();
    assert_eq!(Path::new(here.trim()).canonicalize().unwrap(), worker);
    assert!(!ingress.join("here.txt").exists());

    // Rows other machines forged: another remote (one that holds its
    // commit), a commit that reads as an option, a commit origin lacks.
    let pwned = top.join("pwned");
    let cases = [
        (
            RunCode {
                remote: evil.display().to_string(),
                commit: Some(evil_commit.clone()),
            },
            "this worker's fleet is",
        ),
        (
            RunCode {
                remote: remote.clone(),
                commit: Some(format!("--upload-pack=touch {}", pwned.display())),
            },
            "is not a full hex object id",
        ),
        (
            RunCode {
                remote: remote.clone(),
                commit: Some("f".repeat(40)),
            },
            "even after a fetch",
        ),
    ];
    for (code, says) in cases {
        let run = forged(code);
        let id = run.id.clone();
        rt.block_on(store.enqueue(run)).unwrap();
        let row = ended(&rt, &store, &id);
        assert_eq!(row.state, state::FAILED, "{row:?}");
        let detail = row.detail.unwrap_or_default();
        assert!(detail.contains(says), "{detail}");
        let finished = events_of(&rt, &store, &id);
        assert!(
            finished
                .iter()
                .any(|(k, p)| k == "run.finished" && p["error"] == detail.as_str()),
            "{finished:?}"
        );
    }
    assert!(!pwned.exists());
    assert!(!git_ok(&mirror, &["cat-file", "-e", &evil_commit]));
}
