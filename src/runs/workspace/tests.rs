//! Unit tests of the git side of worktree runs: names, stats, authors.

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
