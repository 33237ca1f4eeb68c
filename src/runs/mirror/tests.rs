//! Unit tests of the mirror: which rows pass the check, and the mirror
//! fetching a commit its checkout does not have, with real git.

use std::path::Path;
use std::sync::Arc;

use super::*;

const SHA1: &str = "0123456789abcdef0123456789abcdef01234567";

fn code(remote: &str, commit: Option<&str>) -> RunCode {
    RunCode {
        remote: remote.to_string(),
        commit: commit.map(str::to_string),
    }
}

#[test]
fn a_row_of_another_remote_or_with_a_commit_that_is_no_object_id_is_refused() {
    const OURS: &str = "https://git.example/repo";
    let ours = Some(OURS);
    assert_eq!(check_code(None, ours), Ok(()));
    assert_eq!(check_code(Some(&code(OURS, Some(SHA1))), ours), Ok(()));
    assert_eq!(check_code(Some(&code(OURS, None)), ours), Ok(()));
    assert!(matches!(
        check_code(Some(&code("https://evil.example/x", Some(SHA1))), ours),
        Err(MirrorError::OtherRemote { .. })
    ));
    assert!(matches!(
        check_code(Some(&code(OURS, Some(SHA1))), None),
        Err(MirrorError::NoMirror(_))
    ));
    for bad in [
        "--upload-pack=touch x",
        "HEAD",
        "main",
        &SHA1[..39],
        &SHA1.to_uppercase(),
        &format!("{SHA1}0"),
        "0123456789abcdef0123456789abcdef0123456g",
    ] {
        assert!(
            matches!(
                check_code(Some(&code(OURS, Some(bad))), ours),
                Err(MirrorError::BadCommit(_))
            ),
            "{bad:?}"
        );
    }
    let sha256 = "a".repeat(64);
    assert_eq!(check_code(Some(&code(OURS, Some(&sha256))), ours), Ok(()));
}

fn supervisor() -> Supervisor {
    let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
    Supervisor::new(events, crate::supervisor::BackoffPolicy::default())
}

async fn sh(supervisor: &Supervisor, dir: &Path, args: &[&str]) -> String {
    let mut all = vec![
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@localhost",
        "-c",
        "init.defaultBranch=main",
    ];
    all.extend_from_slice(args);
    workspace::git(supervisor, dir, &all)
        .await
        .unwrap_or_else(|e| panic!("git {args:?}: {e}"))
}

/// A bare origin, a checkout cloned from it, and a commit pushed to the
/// origin from elsewhere after the clone; returns the new commit.
async fn behind(supervisor: &Supervisor, top: &Path) -> String {
    let origin = top.join("origin.git");
    std::fs::create_dir(&origin).unwrap();
    sh(supervisor, &origin, &["init", "--quiet", "--bare"]).await;
    let writer = top.join("writer");
    std::fs::create_dir(&writer).unwrap();
    sh(supervisor, &writer, &["init", "--quiet"]).await;
    let url = origin.display().to_string();
    sh(supervisor, &writer, &["remote", "add", "origin", &url]).await;
    std::fs::write(writer.join("old.txt"), "old").unwrap();
    sh(supervisor, &writer, &["add", "--all"]).await;
    sh(supervisor, &writer, &["commit", "--quiet", "-m", "old"]).await;
    sh(supervisor, &writer, &["push", "--quiet", "origin", "main"]).await;
    let checkout = top.join("checkout");
    sh(
        supervisor,
        top,
        &["clone", "--quiet", &url, &checkout.display().to_string()],
    )
    .await;
    std::fs::write(writer.join("new.txt"), "new").unwrap();
    sh(supervisor, &writer, &["add", "--all"]).await;
    sh(supervisor, &writer, &["commit", "--quiet", "-m", "new"]).await;
    sh(supervisor, &writer, &["push", "--quiet", "origin", "main"]).await;
    sh(supervisor, &writer, &["rev-parse", "HEAD"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mirror_fetches_a_commit_its_checkout_lacks_one_run_at_a_time() {
    let top = tempfile::tempdir().unwrap();
    let top = top.path().canonicalize().unwrap();
    let supervisor = supervisor();
    let new = behind(&supervisor, &top).await;
    let checkout = top.join("checkout");
    let state = checkout.join(".npc");
    assert!(
        workspace::resolve_commit(&supervisor, &checkout, &new)
            .await
            .is_ok(),
        "a full id is taken as it is"
    );
    assert!(matches!(
        workspace::resolve_commit(&supervisor, &checkout, "no-such-branch").await,
        Err(WorkspaceError::NoSuchRef(_))
    ));
    let mirror = Arc::new(
        Mirror::of(supervisor.clone(), &checkout, &state)
            .await
            .expect("the checkout has an origin"),
    );
    assert_eq!(
        mirror.remote(),
        top.join("origin.git").display().to_string()
    );
    // Two runs at once: one fetches, the other waits its turn and finds
    // the commit there.
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let (mirror, new) = (mirror.clone(), new.clone());
            tokio::spawn(async move { mirror.hold(&new).await.map(drop) })
        })
        .collect();
    for run in runs {
        assert_eq!(run.await.unwrap(), Ok(()));
    }
    let there = sh(&supervisor, mirror.dir(), &["cat-file", "-t", &new]).await;
    assert_eq!(there, "commit");
    // The checkout itself was not touched.
    assert!(!checkout.join("new.txt").exists());
    let missing = "f".repeat(40);
    assert!(matches!(
        mirror.hold(&missing).await,
        Err(MirrorError::NotInRemote { .. })
    ));
    assert!(matches!(
        mirror.hold("--upload-pack=x").await,
        Err(MirrorError::BadCommit(_))
    ));
    // Another process's turn (the lock file held) makes a run wait.
    let root = crate::repofs::Root::new(&checkout).unwrap();
    let file = root.open_private(&state.join(LOCK_FILE)).unwrap();
    let held = Flock::lock(file, FlockArg::LockExclusiveNonblock).unwrap();
    let waiting = tokio::spawn({
        let mirror = mirror.clone();
        let new = new.clone();
        async move { mirror.hold(&new).await.map(drop) }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    drop(held);
    assert_eq!(waiting.await.unwrap(), Ok(()));
}

/// A key and value a hostile mirror's config sets.
type ConfigEntry<'a> = (&'a str, &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_npc_did_not_make_is_made_again_and_nothing_of_it_runs() {
    let top = tempfile::tempdir().unwrap();
    let top = top.path().canonicalize().unwrap();
    let supervisor = supervisor();
    let new = behind(&supervisor, &top).await;
    let checkout = top.join("checkout");
    let state = checkout.join(".npc");
    let mirror = Mirror::of(supervisor.clone(), &checkout, &state)
        .await
        .expect("the checkout has an origin");
    // What npc makes is npc's, run after run.
    mirror.hold(&new).await.map(drop).unwrap();
    assert_eq!(mirror.foreign().await, None);
    mirror.hold(&new).await.map(drop).unwrap();
    assert!(mirror.dir().join("objects").is_dir());
    // A mirror as a clone could ship it: hooks, a file system monitor and
    // an ssh command in its config, each writing the canary.
    let canary = top.join("canary");
    let hostile = |config: &'static [ConfigEntry<'static>], hook: bool| {
        let (supervisor, dir, top, canary) = (&supervisor, mirror.dir(), &top, &canary);
        async move {
            std::fs::remove_dir_all(dir).ok();
            let shown = dir.display().to_string();
            workspace::git_as_user(supervisor, top, &["init", "--quiet", "--bare", &shown]).await;
            let script = top.join("evil.sh");
            let text = format!("#!/bin/sh\necho ran >> '{}'\n", canary.display());
            std::fs::write(&script, text).unwrap();
            let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
            std::fs::set_permissions(&script, executable).unwrap();
            if hook {
                for name in [
                    "post-checkout",
                    "reference-transaction",
                    "post-index-change",
                ] {
                    std::fs::copy(&script, dir.join("hooks").join(name)).unwrap();
                }
            }
            for (key, value) in config {
                let value = value.replace("SCRIPT", &script.display().to_string());
                workspace::git_as_user(supervisor, dir, &["config", key, &value]).await;
            }
        }
    };
    let cases: [(&[ConfigEntry], bool, &str); 4] = [
        (&[], true, "hook `"),
        (&[("core.fsmonitor", "SCRIPT")], false, "`core.fsmonitor`"),
        (&[("core.hooksPath", "/tmp")], false, "`core.hookspath`"),
        (
            &[("include.path", "/etc/gitconfig")],
            false,
            "`include.path`",
        ),
    ];
    for (config, hook, says) in cases {
        hostile(config, hook).await;
        let reason = mirror.foreign().await.unwrap_or_default();
        assert!(reason.contains(says), "{says}: {reason:?}");
        let turn = mirror.hold(&new).await.unwrap();
        assert_eq!(mirror.foreign().await, None, "{says}");
        let root = state.join(workspace::WORKTREES_DIR);
        let id = format!("run-{}", says.len());
        let worktree = workspace::Worktree::create(
            &supervisor,
            &checkout,
            &root,
            &id,
            "HEAD",
            &format!("npc/{id}"),
            workspace::Start::Mirror {
                git: mirror.dir(),
                commit: &new,
            },
        )
        .await
        .unwrap();
        drop(turn);
        assert!(worktree.dir.join("new.txt").is_file());
        worktree.remove(&supervisor).await.unwrap();
        assert!(
            !canary.exists(),
            "{says}: {:?}",
            std::fs::read_to_string(&canary)
        );
    }
    // One the checkout tracks came with a clone: refused (made again, it
    // would still be tracked), and left as it is.
    sh(
        &supervisor,
        &checkout,
        &["add", "--force", ".npc/mirror.git/HEAD"],
    )
    .await;
    let refused = mirror.hold(&new).await.map(drop);
    assert!(
        matches!(refused, Err(MirrorError::Shipped { .. })),
        "{refused:?}"
    );
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("git rm -r --cached .npc/mirror.git")
    );
    assert!(mirror.dir().join("objects").is_dir());
}
