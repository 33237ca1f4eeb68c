use super::*;

#[test]
fn claude_trust_is_added_to_the_user_config_keeping_the_rest() {
    let dir = Path::new("/repo/.npc/worktrees/run-1");
    let before = r#"{"numStartups": 3, "projects": {"/other": {"allowedTools": ["Bash"]}, "/repo/.npc/worktrees/run-1": {"lastCost": 1}}}"#;
    let after = claude_trusted(Some(before), dir).unwrap();
    let v: Value = serde_json::from_str(&after).unwrap();
    assert_eq!(v["numStartups"], 3);
    assert_eq!(v["projects"]["/other"]["allowedTools"][0], "Bash");
    assert_eq!(v["projects"][dir.to_str().unwrap()]["lastCost"], 1);
    assert_eq!(v["projects"][dir.to_str().unwrap()][CLAUDE_TRUST_KEY], true);
    assert!(crate::native::doctor::claude_trusts(Some(&after), dir));
    // No file yet: one with the entry.
    let fresh = claude_trusted(None, dir).unwrap();
    assert!(crate::native::doctor::claude_trusts(Some(&fresh), dir));
    // What npc cannot edit as a document it leaves alone.
    assert_eq!(claude_trusted(Some("not json"), dir), None);
    assert_eq!(claude_trusted(Some("[1]"), dir), None);
    assert_eq!(claude_trusted(Some(r#"{"projects": 3}"#), dir), None);
}

#[test]
fn claude_trust_of_a_directory_above_covers_the_worktree() {
    let dir = Path::new("/repo/.npc/worktrees/run-1");
    let parent = r#"{"projects": {"/repo": {"hasTrustDialogAccepted": true}}}"#;
    assert!(crate::native::doctor::claude_trusts(Some(parent), dir));
    let other = r#"{"projects": {"/repo2": {"hasTrustDialogAccepted": true}}}"#;
    assert!(!crate::native::doctor::claude_trusts(Some(other), dir));
    let refused = r#"{"projects": {"/repo": {"hasTrustDialogAccepted": false}}}"#;
    assert!(!crate::native::doctor::claude_trusts(Some(refused), dir));
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

/// Only `WORKTREES/RUN-ID`, a real directory, is trusted: a path a
/// repository could name (a link out, another directory) is refused.
#[test]
fn only_a_worktree_npc_made_is_trusted() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let worktrees = root.join("worktrees");
    std::fs::create_dir_all(worktrees.join("run-1")).unwrap();
    std::fs::create_dir_all(root.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(root.join("elsewhere"), worktrees.join("run-2")).unwrap();
    std::fs::create_dir_all(worktrees.join("not-a-run")).unwrap();
    let mut spec = ChildSpec::new("gemini".to_string(), root.clone());
    let plan = |dir: PathBuf| TrustPlan {
        kind: ProviderKind::GeminiCli,
        dir,
        worktrees: worktrees.clone(),
    };
    assert_eq!(
        plan(worktrees.join("run-1")).establish(&mut spec),
        Ok(Established::ForTheRun)
    );
    assert_eq!(spec.env[GEMINI_TRUST_ENV], "true");
    for bad in [
        worktrees.join("run-2"),
        worktrees.join("not-a-run"),
        root.join("elsewhere"),
        worktrees.join("run-1/.."),
    ] {
        let mut spec = ChildSpec::new("gemini".to_string(), root.clone());
        let e = plan(bad.clone()).establish(&mut spec).unwrap_err();
        assert!(e.to_string().contains("does not trust"), "{e}");
        assert!(spec.env.get(GEMINI_TRUST_ENV).is_none(), "{bad:?}");
    }
}

/// Claude Code's trust is stored in the user config `CLAUDE_CONFIG_DIR`
/// names; a config that does not parse is left alone and the run refused
/// with the fix.
#[test]
fn claude_trust_is_stored_once_or_refused_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let worktrees = root.join("worktrees");
    let dir = worktrees.join("run-1");
    std::fs::create_dir_all(&dir).unwrap();
    let config_dir = root.join("claude");
    std::fs::create_dir_all(&config_dir).unwrap();
    let mut spec = ChildSpec::new("claude".to_string(), dir.clone());
    spec.env.insert(
        "CLAUDE_CONFIG_DIR".to_string(),
        config_dir.to_string_lossy().into_owned(),
    );
    let plan = TrustPlan {
        kind: ProviderKind::ClaudeCode,
        dir: dir.clone(),
        worktrees,
    };
    let file = config_dir.join(CLAUDE_CONFIG_FILE);
    assert_eq!(
        plan.establish(&mut spec.clone()),
        Ok(Established::Stored { file: file.clone() })
    );
    assert_eq!(plan.establish(&mut spec.clone()), Ok(Established::Already));
    std::fs::write(&file, "{ not json").unwrap();
    let e = plan.establish(&mut spec.clone()).unwrap_err();
    assert!(e.fix.contains("hasTrustDialogAccepted"), "{e}");
    assert!(e.to_string().contains(&file.display().to_string()), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "{ not json");
}
