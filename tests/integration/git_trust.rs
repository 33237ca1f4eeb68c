//! What git hands npc is untrusted, through the real binary and real git:
//! a run's branch is only ever created on `origin` (a branch origin has
//! already — one the checkout lacks, another run's, one made while the run
//! worked — is never moved), branch names that name something besides one
//! branch are refused, no hook or file system monitor of the checkout, of
//! an agent's making or of a shipped mirror runs, and `npc runs clean`
//! reports only what it removed.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{Daemon, npc};
use crate::worktrees::{ended, fire, git, repository, show};

/// The manifest of the push tests: `plain` pushes `npc/{{ run.id }}`,
/// `ship` the branch its payload names, `racy` a branch its action makes
/// on origin (`ORIGIN`) while the run works.
const PUSHING: &str = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.plain]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
push = true
action = { command = "sh", args = ["-c", "echo plain > plain.txt"] }

[triggers.ship]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
push = true
branch = "{{ payload.b }}"
action = { command = "sh", args = ["-c", "echo shipped > shipped.txt"] }

[triggers.racy]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
push = true
branch = "late"
action = { command = "sh", args = ["-c", "echo racy > racy.txt; git --git-dir='ORIGIN' branch late main"] }
"#;

/// A checkout of `manifest` (`ORIGIN` in it replaced by the bare origin's
/// path) whose `main` is on its `origin`; the checkout and the origin.
fn with_origin(manifest: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    let origin = tempfile::tempdir().unwrap();
    git(
        origin.path(),
        &["init", "--quiet", "--bare", "--initial-branch=main"],
    );
    let url = origin.path().display().to_string();
    let dir = repository(&manifest.replace("ORIGIN", &url), &[("a.txt", "a\n")]);
    git(dir.path(), &["remote", "add", "origin", &url]);
    git(dir.path(), &["push", "--quiet", "origin", "main"]);
    (dir, origin)
}

/// Every ref of the repository `dir` with its object.
fn refs(dir: &Path) -> String {
    git(dir, &["for-each-ref", "--format=%(refname) %(objectname)"])
}

/// The events of run `id` of kind `kind`.
fn events_of(run: &Value, kind: &str) -> Vec<Value> {
    run["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == kind)
        .cloned()
        .collect()
}

#[test]
fn a_pushing_run_creates_its_branch_on_origin_and_never_moves_one_origin_has() {
    let (dir, origin) = with_origin(PUSHING);
    let main = git(origin.path(), &["rev-parse", "main"])
        .trim()
        .to_string();
    // Origin has `taken`; the checkout never fetched it.
    git(origin.path(), &["branch", "taken", "main"]);
    let _daemon = Daemon::start_in(dir.path());

    // A new branch is pushed.
    let first = fire(dir.path(), "plain", "{}");
    ended(dir.path(), 1);
    let run = show(dir.path(), &first);
    assert_eq!(run["run"]["state"], "succeeded", "{run}");
    assert_eq!(run["run"]["result"]["push"]["ok"], true, "{run}");
    let other = format!("npc/{first}");
    let head = git(origin.path(), &["rev-parse", &other]);
    assert_eq!(head.trim(), run["run"]["result"]["head"].as_str().unwrap());
    // The checkout forgets it; another run's payload names it.
    git(dir.path(), &["branch", "--delete", "--force", &other]);
    let before = refs(origin.path());
    let mut n = 1;
    for branch in [other.as_str(), "taken"] {
        let payload = serde_json::json!({ "b": branch }).to_string();
        let id = fire(dir.path(), "ship", &payload);
        n += 1;
        ended(dir.path(), n);
        let run = show(dir.path(), &id);
        assert_eq!(run["run"]["state"], "failed", "{run}");
        let detail = run["run"]["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(&format!("branch `{branch}` exists on `origin` already")),
            "{detail}"
        );
        assert!(!dir.path().join(".npc/worktrees").join(&id).exists());
    }
    assert_eq!(refs(origin.path()), before);
    assert_eq!(git(origin.path(), &["rev-parse", "taken"]).trim(), main);

    // Made on origin while the run worked: the push's lease refuses it.
    let id = fire(dir.path(), "racy", "{}");
    ended(dir.path(), n + 1);
    let run = show(dir.path(), &id);
    assert_eq!(run["run"]["state"], "succeeded", "{run}");
    let push = &run["run"]["result"]["push"];
    assert_eq!(push["ok"], false, "{push}");
    let error = push["error"].as_str().unwrap();
    assert!(
        error.contains("branch `late` exists on `origin` already"),
        "{error}"
    );
    let failed = events_of(&run, "run.push_failed");
    assert_eq!(failed.len(), 1, "{run}");
    assert_eq!(failed[0]["payload"]["branch"], "late", "{run}");
    assert_eq!(git(origin.path(), &["rev-parse", "late"]).trim(), main);
    // The run's work stays on its branch in the checkout.
    let late = git(dir.path(), &["show", "late:racy.txt"]);
    assert_eq!(late, "racy\n");
}

#[test]
fn branch_names_that_name_something_besides_one_branch_are_refused() {
    let (dir, origin) = with_origin(PUSHING);
    git(dir.path(), &["tag", "v1"]);
    let _daemon = Daemon::start_in(dir.path());
    let (mine, theirs) = (refs(dir.path()), refs(origin.path()));
    let names = [
        "@",
        "HEAD",
        "refs/heads/main",
        "refs/tags/v1",
        "tags/v1",
        "x.lock",
    ];
    for (n, branch) in names.iter().enumerate() {
        let payload = serde_json::json!({ "b": branch }).to_string();
        let id = fire(dir.path(), "ship", &payload);
        ended(dir.path(), n + 1);
        let run = show(dir.path(), &id);
        assert_eq!(run["run"]["state"], "failed", "{branch}: {run}");
        let detail = run["run"]["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(&format!("`{branch}` is not a valid branch name")),
            "{branch}: {detail}"
        );
    }
    assert_eq!(refs(dir.path()), mine);
    assert_eq!(refs(origin.path()), theirs);
    // A literal name is checked by `npc validate` already.
    let manifest = PUSHING.replace("branch = \"late\"", "branch = \"refs/heads/main\"");
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["validate"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("`branch` `refs/heads/main` is not a valid name"),
        "{said}"
    );
}

/// The manifest of the hook tests: the action writes a `.husky` hook into
/// its worktree and points the repository's `core.hooksPath` at it, as an
/// agent could; its branch is pushed.
const HUSKY: &str = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.agent]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
push = true
action = { command = "sh", args = ["-c", "mkdir .husky && cp 'SCRIPT' .husky/post-commit && cp 'SCRIPT' .husky/reference-transaction && git config core.hooksPath \"$PWD/.husky\" && echo work > work.txt"] }
"#;

/// An executable script in `top` that appends a line to `canary`.
fn canary_script(top: &Path, canary: &Path) -> PathBuf {
    let script = top.join("evil.sh");
    let text = format!("#!/bin/sh\necho ran >> '{}'\n", canary.display());
    std::fs::write(&script, text).unwrap();
    let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&script, executable).unwrap();
    script
}

#[test]
fn no_hook_or_file_system_monitor_runs_for_a_worktree_run() {
    let top = tempfile::tempdir().unwrap();
    let canary = top.path().join("canary");
    let script = canary_script(top.path(), &canary);
    let (dir, origin) = with_origin(&HUSKY.replace("SCRIPT", &script.display().to_string()));
    // The checkout's own config: hooks for everything npc does, and a
    // file system monitor.
    let hooks = top.path().join("hooks");
    std::fs::create_dir(&hooks).unwrap();
    for hook in [
        "post-checkout",
        "reference-transaction",
        "post-index-change",
        "pre-commit",
        "post-commit",
        "pre-push",
    ] {
        std::fs::copy(&script, hooks.join(hook)).unwrap();
    }
    let shown = |p: &Path| p.display().to_string();
    git(dir.path(), &["config", "core.hooksPath", &shown(&hooks)]);
    git(dir.path(), &["config", "core.fsmonitor", &shown(&script)]);
    let daemon = Daemon::start_in(dir.path());
    let id = fire(dir.path(), "agent", "{}");
    ended(dir.path(), 1);
    let run = show(dir.path(), &id);
    assert_eq!(run["run"]["state"], "succeeded", "{run}");
    assert_eq!(run["run"]["result"]["push"]["ok"], true, "{run}");
    let pushed = git(origin.path(), &["show", &format!("npc/{id}:work.txt")]);
    assert_eq!(pushed, "work\n");
    drop(daemon);
    assert!(!canary.exists(), "{:?}", std::fs::read_to_string(&canary));
    // The hooks are live for git run by hand: the test could fail.
    git(
        dir.path(),
        &["commit", "--quiet", "--allow-empty", "-m", "b"],
    );
    assert!(canary.exists());
}

const FAILING: &str = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.fail]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
action = { command = "sh", args = ["-c", "echo half > work.txt; exit 3"] }
"#;

#[test]
fn runs_clean_reports_only_the_worktrees_it_removed() {
    let dir = repository(FAILING, &[("a.txt", "a\n")]);
    let daemon = Daemon::start_in(dir.path());
    let gone = fire(dir.path(), "fail", "{}");
    ended(dir.path(), 1);
    let kept = fire(dir.path(), "fail", "{}");
    ended(dir.path(), 2);
    drop(daemon);
    let worktrees = dir.path().join(".npc/worktrees");
    // One kept worktree was removed by hand.
    std::fs::remove_dir_all(worktrees.join(&gone)).unwrap();
    assert!(worktrees.join(&kept).is_dir());
    let clean = || {
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
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["removed"].clone()
    };
    assert_eq!(clean(), serde_json::json!([kept]));
    assert!(!worktrees.join(&kept).exists());
    // Nothing is left to remove, and nothing is said to be.
    assert_eq!(clean(), serde_json::json!([]));
    let human = npc()
        .current_dir(dir.path())
        .args(["runs", "clean", "--all"])
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("no kept worktree to remove"), "{human}");
    let listed = git(dir.path(), &["worktree", "list", "--porcelain"]);
    assert_eq!(listed.matches("worktree ").count(), 1, "{listed}");
}

/// The fleet's manifest: `ship` pushes the branch its payload names.
const FLEET: &str = r#"version = 1
[project]
name = "git-trust"
[store]
url = "${NPC_STORE_URL}"

[triggers.ship]
kind = "cron"
schedule = "24h"
workspace = "worktree"
push = true
branch = "{{ payload.b }}"
action = { command = "sh", args = ["-c", "echo shipped > shipped.txt"] }
"#;

#[test]
fn a_worker_never_uses_a_shipped_mirror_nor_pushes_onto_a_branch_origin_has() {
    use crate::fleet::{STEADY_LEASE_SECS, ingress_daemon, npc_json, start_worker_leased};
    use crate::fleet_code::{commit, ended};
    use npcagent::store::queue::state;
    let Some(cluster) = crate::pg::PgCluster::start() else {
        return;
    };
    let top = tempfile::tempdir().unwrap();
    let top = top.path().canonicalize().unwrap();
    let canary = top.join("canary");
    let script = canary_script(&top, &canary);
    let origin = top.join("origin.git");
    let remote = origin.display().to_string();
    git(
        &top,
        &[
            "init",
            "--quiet",
            "--bare",
            "--initial-branch=main",
            &remote,
        ],
    );
    // The repository ships a mirror whose hooks and file system monitor
    // write the canary.
    let ingress = top.join("ingress");
    git(&top, &["clone", "--quiet", &remote, "ingress"]);
    git(&ingress, &["symbolic-ref", "HEAD", "refs/heads/main"]);
    std::fs::write(ingress.join("npcagent.toml"), FLEET).unwrap();
    let shipped = ingress
        .join(".npc")
        .join(npcagent::runs::mirror::MIRROR_DIR);
    git(
        &top,
        &["init", "--quiet", "--bare", &shipped.display().to_string()],
    );
    for hook in [
        "post-checkout",
        "reference-transaction",
        "post-index-change",
    ] {
        std::fs::copy(&script, shipped.join("hooks").join(hook)).unwrap();
    }
    let monitor = script.display().to_string();
    git(&shipped, &["config", "core.fsmonitor", &monitor]);
    git(&ingress, &["add", "--all", "--force"]);
    let main = commit(&ingress, "start");
    git(&ingress, &["push", "--quiet", "origin", "main"]);
    git(&top, &["clone", "--quiet", &remote, "worker"]);
    let worker = top.join("worker");
    let mirror = worker.join(".npc").join(npcagent::runs::mirror::MIRROR_DIR);
    assert!(mirror.join("hooks/post-checkout").is_file());

    let url = crate::fleet::worker_store(&cluster, &ingress);
    let daemon = ingress_daemon(&ingress, &url);
    crate::support::wait_for("the ingress to join the fleet", || {
        let status = npc_json(&ingress, &url, &["status"]);
        (status["store"]["state"] == "connected").then_some(())
    });
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("worker.log");
    let _worker =
        crate::support::Stopped::new(start_worker_leased(&worker, &url, &log, STEADY_LEASE_SECS));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fleet = format!("git-trust@{remote}");
    let store = rt
        .block_on(npcagent::store::pg::PgStore::connect(&url, &fleet))
        .unwrap();
    let why = || {
        format!(
            "{}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default(),
            daemon.log()
        )
    };
    let ship = |branch: &str| {
        let payload = serde_json::json!({ "b": branch }).to_string();
        let answer = npc_json(
            &ingress,
            &url,
            &["trigger", "fire", "ship", "--payload", &payload],
        );
        let id = answer["run_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}\n{}", why()));
        ended(&rt, &store, id)
    };

    // Tracked by the checkout: refused, left as it is.
    let row = ship("fresh");
    assert_eq!(row.state, state::FAILED, "{row:?}\n{}", why());
    let detail = row.detail.clone().unwrap_or_default();
    assert!(
        detail.contains("git rm -r --cached .npc/mirror.git"),
        "{detail}"
    );
    // No longer tracked, still hostile: made again, and the run works.
    git(
        &worker,
        &["rm", "--quiet", "-r", "--cached", ".npc/mirror.git"],
    );
    git(&worker, &["commit", "--quiet", "-m", "no mirror"]);
    let row = ship("fresh");
    assert_eq!(row.state, state::SUCCEEDED, "{row:?}\n{}", why());
    let result = row.result.clone().unwrap_or_default();
    assert_eq!(result["push"]["ok"], true, "{row:?}");
    assert_eq!(git(&origin, &["rev-parse", "fresh"]).trim(), result["head"]);
    assert!(!mirror.join("hooks").exists());
    let config = std::fs::read_to_string(mirror.join("config")).unwrap();
    assert!(!config.contains("fsmonitor"), "{config}");
    // A payload naming origin's `main`, or the branch just pushed: refused
    // before the run works, both left where they were.
    let before = refs(&origin);
    for branch in ["main", "fresh"] {
        let row = ship(branch);
        assert_eq!(row.state, state::FAILED, "{row:?}\n{}", why());
        let detail = row.detail.clone().unwrap_or_default();
        assert!(
            detail.contains(&format!("branch `{branch}` exists on `origin` already")),
            "{detail}"
        );
    }
    assert_eq!(refs(&origin), before);
    assert_eq!(git(&origin, &["rev-parse", "main"]).trim(), main);
    assert!(!canary.exists(), "{:?}", std::fs::read_to_string(&canary));
}
