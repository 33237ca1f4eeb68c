//! Unit tests of the git side of worktree runs: names, stats, authors;
//! with real git, that no hook or file system monitor runs for npc and
//! that a push only ever creates a branch on `origin`.

use super::*;

#[test]
fn shortstat_lines_are_read() {
    assert_eq!(
        parse_shortstat(" 3 files changed, 10 insertions(+), 2 deletions(-)"),
        (3, 10, 2)
    );
    assert_eq!(parse_shortstat(" 1 file changed, 1 deletion(-)"), (1, 0, 1));
    assert_eq!(parse_shortstat(""), (0, 0, 0));
    assert_eq!(parse_shortstat("garbage, more garbage"), (0, 0, 0));
}

#[test]
fn refs_that_read_as_options_or_ranges_are_refused() {
    for bad in [
        "",
        "-b",
        "--upload-pack=x",
        "a..b",
        "a b",
        "a\nb",
        "x@{1}",
        "a~1",
        "a^",
        "a:b",
        "a/",
        "a.",
        "*",
    ] {
        assert!(check_ref_name("ref", bad).is_err(), "{bad:?}");
    }
    for good in ["HEAD", "main", "npc/run-1", "refs/heads/x", "0123abcd"] {
        assert!(check_ref_name("ref", good).is_ok(), "{good:?}");
    }
    assert!(check_ref_name("ref", &"a".repeat(MAX_REF_BYTES + 1)).is_err());
    for ambiguous in [
        "@",
        "HEAD",
        "refs/heads/main",
        "refs/tags/v1",
        "tags/v1",
        "x.lock",
    ] {
        assert!(
            matches!(
                check_branch_name(ambiguous),
                Err(WorkspaceError::BadName {
                    what: "branch name",
                    ..
                })
            ),
            "{ambiguous:?}"
        );
    }
    assert_eq!(check_branch_name("npc/run-1"), Ok(()));
}

#[test]
fn authors_split_into_name_and_email() {
    assert_eq!(
        split_author("npc bot <bot@example.com>"),
        ("npc bot".to_string(), "bot@example.com".to_string())
    );
    assert_eq!(
        split_author("solo"),
        ("solo".to_string(), "npc@localhost".to_string())
    );
}

#[tokio::test]
async fn a_run_id_that_is_not_npcs_names_no_worktree_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
    let supervisor = Supervisor::new(events, crate::supervisor::BackoffPolicy::default());
    git(&supervisor, dir.path(), &["init", "--quiet"])
        .await
        .unwrap();
    let root = dir.path().join("wt");
    for id in ["../escape", "run-../x", "/tmp/x", "run-A"] {
        let made = Worktree::create(
            &supervisor,
            dir.path(),
            &root,
            id,
            "HEAD",
            "b",
            Start::Checkout,
        )
        .await;
        assert!(
            matches!(made, Err(WorkspaceError::BadName { what: "run id", .. })),
            "{id}: {made:?}"
        );
    }
    assert!(!root.exists() && !dir.path().join("escape").exists());
    assert!(is_run_id("run-20261201t000000000z-0a1b2c3d"));
}

#[tokio::test]
async fn cleaning_through_a_linked_worktrees_directory_removes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let victim = elsewhere.path().join("run-20261201t000000000z-0a1b2c3d");
    std::fs::create_dir(&victim).unwrap();
    let root = dir.path().canonicalize().unwrap().join("wt");
    std::os::unix::fs::symlink(elsewhere.path(), &root).unwrap();
    let store =
        std::sync::Arc::new(crate::store::Store::open(dir.path().join("state.db")).unwrap());
    let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
    let supervisor = Supervisor::new(events, crate::supervisor::BackoffPolicy::default());
    let policy = KeepPolicy {
        keep_failed: Duration::ZERO,
        max_kept: 0,
        all: true,
    };
    let cleaned = clean(&store, &supervisor, dir.path(), &root, policy).await;
    assert!(
        matches!(cleaned, Err(WorkspaceError::Dir { .. })),
        "{cleaned:?}"
    );
    assert!(victim.is_dir());
}

fn supervisor() -> Supervisor {
    let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
    Supervisor::new(events, crate::supervisor::BackoffPolicy::default())
}

/// The hooks that run around what npc does with a worktree.
const HOOKS: [&str; 7] = [
    "post-checkout",
    "reference-transaction",
    "post-index-change",
    "pre-commit",
    "post-commit",
    "pre-push",
    "fsmonitor",
];

/// A bare `origin`, and a checkout of it with one commit pushed whose
/// config runs `hooks/*` and a file system monitor, each appending its name
/// to `canary`; returns the checkout, `origin` and the canary.
async fn hostile(supervisor: &Supervisor, top: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let origin = top.join("origin.git");
    let checkout = top.join("checkout");
    let canary = top.join("canary");
    git_as_user(
        supervisor,
        top,
        &["init", "--quiet", "--bare", "origin.git"],
    )
    .await;
    git_as_user(
        supervisor,
        top,
        &["init", "--quiet", "--initial-branch=main", "checkout"],
    )
    .await;
    std::fs::write(checkout.join("a.txt"), "a").unwrap();
    git_as_user(supervisor, &checkout, &["add", "--all"]).await;
    git_as_user(supervisor, &checkout, &["commit", "--quiet", "-m", "a"]).await;
    let url = origin.display().to_string();
    git_as_user(supervisor, &checkout, &["remote", "add", "origin", &url]).await;
    git_as_user(
        supervisor,
        &checkout,
        &["push", "--quiet", "origin", "main"],
    )
    .await;
    let hooks = top.join("hooks");
    std::fs::create_dir(&hooks).unwrap();
    for hook in HOOKS {
        let path = hooks.join(hook);
        let script = format!("#!/bin/sh\necho {hook} >> '{}'\n", canary.display());
        std::fs::write(&path, script).unwrap();
        let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&path, executable).unwrap();
    }
    let hooks_path = hooks.display().to_string();
    git_as_user(
        supervisor,
        &checkout,
        &["config", "core.hooksPath", &hooks_path],
    )
    .await;
    let monitor = hooks.join("fsmonitor").display().to_string();
    git_as_user(
        supervisor,
        &checkout,
        &["config", "core.fsmonitor", &monitor],
    )
    .await;
    (checkout, origin, canary)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hook_and_no_file_system_monitor_runs_for_npcs_git_commands() {
    let top = tempfile::tempdir().unwrap();
    let top = top.path().canonicalize().unwrap();
    let supervisor = supervisor();
    let (checkout, origin, canary) = hostile(&supervisor, &top).await;
    // The hooks are live: git run as a user runs them.
    git_as_user(&supervisor, &checkout, &["status", "--porcelain"]).await;
    git_as_user(
        &supervisor,
        &checkout,
        &["commit", "--quiet", "--allow-empty", "-m", "b"],
    )
    .await;
    let ran = std::fs::read_to_string(&canary).unwrap();
    assert!(
        ran.contains("fsmonitor") && ran.contains("post-commit"),
        "{ran}"
    );
    std::fs::remove_file(&canary).unwrap();
    // npc's worktree run: made, committed, measured, pushed, removed.
    let root = checkout.join(".npc").join(WORKTREES_DIR);
    let worktree = Worktree::create(
        &supervisor,
        &checkout,
        &root,
        "run-1",
        "HEAD",
        "npc/run-1",
        Start::Checkout,
    )
    .await
    .unwrap();
    std::fs::write(worktree.dir.join("b.txt"), "b").unwrap();
    let result = worktree
        .conclude(&supervisor, "npc run", DEFAULT_AUTHOR)
        .await
        .unwrap();
    assert!(result.committed && result.files == 1, "{result:?}");
    git(&supervisor, &worktree.dir, &["status", "--porcelain"])
        .await
        .unwrap();
    worktree.push(&supervisor).await.unwrap();
    patch(&supervisor, &checkout, &result).await.unwrap();
    worktree.remove(&supervisor).await.unwrap();
    assert!(!canary.exists(), "{:?}", std::fs::read_to_string(&canary));
    let pushed = git_as_user(&supervisor, &origin, &["rev-parse", "refs/heads/npc/run-1"]).await;
    assert_eq!(pushed, result.head);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_only_creates_a_branch_on_origin_and_never_moves_one() {
    let top = tempfile::tempdir().unwrap();
    let top = top.path().canonicalize().unwrap();
    let supervisor = supervisor();
    let (checkout, origin, _) = hostile(&supervisor, &top).await;
    // Origin has `taken`, which the checkout never had.
    let main = git_as_user(&supervisor, &origin, &["rev-parse", "refs/heads/main"]).await;
    git_as_user(&supervisor, &origin, &["branch", "taken", "main"]).await;
    assert_eq!(
        check_new_on_origin(&supervisor, &checkout, "taken").await,
        Err(WorkspaceError::BranchOnOrigin("taken".to_string()))
    );
    assert_eq!(
        check_new_on_origin(&supervisor, &checkout, "fresh").await,
        Ok(())
    );
    let root = checkout.join(".npc").join(WORKTREES_DIR);
    for (id, branch) in [("run-1", "taken"), ("run-2", "main")] {
        if branch == "main" {
            // The checkout's own `main` is taken locally; a mirror's is not.
            git_as_user(&supervisor, &checkout, &["branch", "-m", "main", "trunk"]).await;
        }
        let worktree = Worktree::create(
            &supervisor,
            &checkout,
            &root,
            id,
            "HEAD",
            branch,
            Start::Checkout,
        )
        .await
        .unwrap();
        std::fs::write(worktree.dir.join(format!("{id}.txt")), id).unwrap();
        let result = worktree
            .conclude(&supervisor, "npc run", DEFAULT_AUTHOR)
            .await
            .unwrap();
        // A fast-forward of origin's branch, refused all the same.
        assert_eq!(
            git_as_user(&supervisor, &origin, &["rev-parse", branch]).await,
            main
        );
        assert_ne!(result.head, main);
        let pushed = worktree.push(&supervisor).await;
        assert_eq!(
            pushed,
            Err(WorkspaceError::BranchOnOrigin(branch.to_string()))
        );
        assert!(
            pushed
                .unwrap_err()
                .to_string()
                .contains(&format!("`{branch}`"))
        );
        assert_eq!(
            git_as_user(&supervisor, &origin, &["rev-parse", branch]).await,
            main
        );
    }
}
