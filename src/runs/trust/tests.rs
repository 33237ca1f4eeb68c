//! Unit tests of worktree trust: each CLI's way, only npc's own worktrees,
//! Claude Code's trust of a worktree's repository.

use super::*;

#[test]
fn claude_trusts_the_project_entry_itself() {
    let root = Path::new("/repo");
    let trusted = r#"{"projects": {"/repo": {"hasTrustDialogAccepted": true}}}"#;
    assert!(claude_project_trusted(Some(trusted), root));
    // A parent's entry is not the project's (Claude Code checks the key).
    assert!(!claude_project_trusted(
        Some(trusted),
        Path::new("/repo/sub")
    ));
    let refused = r#"{"projects": {"/repo": {"hasTrustDialogAccepted": false}}}"#;
    assert!(!claude_project_trusted(Some(refused), root));
    assert!(!claude_project_trusted(Some("not json"), root));
    assert!(!claude_project_trusted(None, root));
}

#[test]
fn codex_trust_is_one_override_with_the_path_quoted() {
    let pair = codex_trust_override(Path::new("/r/.npc/worktrees/run-1"));
    assert_eq!(
        pair,
        r#"projects={"/r/.npc/worktrees/run-1"={trust_level="trusted"}}"#
    );
    // The value is TOML Codex reads: one project, trusted.
    let table: toml::Table = format!("x = {}", pair.split_once('=').unwrap().1)
        .parse()
        .unwrap();
    assert_eq!(
        table["x"]["/r/.npc/worktrees/run-1"]["trust_level"].as_str(),
        Some("trusted")
    );
    let odd = codex_trust_override(Path::new("/r/a\"b\\c/run-1"));
    let table: toml::Table = format!("x = {}", odd.split_once('=').unwrap().1)
        .parse()
        .unwrap();
    assert!(table["x"].get("/r/a\"b\\c/run-1").is_some(), "{odd}");
}

/// A worktrees directory with `run-1` (real), `run-2` (a link out) and
/// `not-a-run`; the repository beside them.
fn layout() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let worktrees = root.join("worktrees");
    std::fs::create_dir_all(worktrees.join("run-1")).unwrap();
    std::fs::create_dir_all(root.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(root.join("elsewhere"), worktrees.join("run-2")).unwrap();
    std::fs::create_dir_all(worktrees.join("not-a-run")).unwrap();
    (tmp, root, worktrees)
}

/// Only `WORKTREES/RUN-ID`, a real directory, is trusted: a path a
/// repository could name (a link out, another directory) is refused.
#[test]
fn only_a_worktree_npc_made_is_trusted() {
    let (_tmp, root, worktrees) = layout();
    let plan = |kind, dir: PathBuf| TrustPlan {
        kind,
        dir,
        worktrees: worktrees.clone(),
        repository: root.clone(),
    };
    let mut spec = ChildSpec::new("gemini".to_string(), root.clone());
    assert_eq!(
        plan(ProviderKind::GeminiCli, worktrees.join("run-1")).establish(&mut spec),
        Ok(Established::ForTheRun)
    );
    assert_eq!(spec.env[GEMINI_TRUST_ENV], "true");
    let mut spec = ChildSpec::new("codex".to_string(), root.clone()).args([
        "exec".to_string(),
        "--".to_string(),
        "task".to_string(),
    ]);
    assert_eq!(
        plan(ProviderKind::Codex, worktrees.join("run-1")).establish(&mut spec),
        Ok(Established::ForTheRun)
    );
    assert_eq!(spec.args[0], "exec");
    assert_eq!(spec.args[1], "-c");
    assert_eq!(spec.args[2], codex_trust_override(&worktrees.join("run-1")));
    assert_eq!(&spec.args[3..], ["--", "task"]);
    for bad in [
        worktrees.join("run-2"),
        worktrees.join("not-a-run"),
        root.join("elsewhere"),
        worktrees.join("run-1/.."),
    ] {
        let mut spec = ChildSpec::new("gemini".to_string(), root.clone());
        let e = plan(ProviderKind::GeminiCli, bad.clone())
            .establish(&mut spec)
            .unwrap_err();
        assert!(e.to_string().contains("does not trust"), "{e}");
        assert!(!spec.env.contains_key(GEMINI_TRUST_ENV), "{bad:?}");
    }
}

/// Claude Code: a worktree without settings it would ignore needs nothing;
/// with them, its repository must be trusted, else the run is refused with
/// the fix (npc writes nothing).
#[test]
fn a_claude_worktree_with_settings_needs_its_repository_trusted() {
    let (_tmp, root, worktrees) = layout();
    let config_dir = root.join("claude");
    std::fs::create_dir_all(&config_dir).unwrap();
    let mut spec = ChildSpec::new("claude".to_string(), worktrees.join("run-1"));
    spec.env.insert(
        "CLAUDE_CONFIG_DIR".to_string(),
        config_dir.to_string_lossy().into_owned(),
    );
    let plan = TrustPlan {
        kind: ProviderKind::ClaudeCode,
        dir: worktrees.join("run-1"),
        worktrees: worktrees.clone(),
        repository: root.clone(),
    };
    assert_eq!(plan.establish(&mut spec.clone()), Ok(Established::Already));
    std::fs::create_dir_all(worktrees.join("run-1/.claude")).unwrap();
    std::fs::write(worktrees.join("run-1/.claude/settings.json"), "{}").unwrap();
    let e = plan.establish(&mut spec.clone()).unwrap_err();
    let file = config_dir.join(CLAUDE_CONFIG_FILE);
    assert!(
        e.fix.contains(&format!(
            "projects[\"{}\"].hasTrustDialogAccepted",
            root.display()
        )),
        "{e}"
    );
    assert!(e.fix.contains(&file.display().to_string()), "{e}");
    assert!(!file.exists(), "npc writes no CLI's user config");
    let trusted =
        serde_json::json!({ "projects": { root.to_str().unwrap(): { CLAUDE_TRUST_KEY: true } } });
    std::fs::write(&file, trusted.to_string()).unwrap();
    assert_eq!(plan.establish(&mut spec.clone()), Ok(Established::Already));
}
