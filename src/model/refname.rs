//! Git ref and branch names as npc accepts them, pure: what `npc validate`
//! checks of a literal `ref` or `branch` and what a run checks of the
//! rendered ones (`runs::workspace::check_ref_name`, `check_branch_name`)
//! before any git command sees them. A ref (what a worktree starts from)
//! must not read as an option or a revision range; a run's branch must
//! moreover name one branch and nothing else: not `@`, `HEAD` or another
//! of git's pseudo refs, not a full ref name (`refs/heads/main`,
//! `refs/tags/v1`), not a name git would look up as another ref first
//! (`heads/x`, `tags/v1`, `remotes/origin/main`), no component starting
//! with `.` or ending with `.lock`.

/// Longest ref or branch name accepted (git's own limit is the file system's).
pub const MAX_REF_BYTES: usize = 255;
/// First components of a branch name that git reads as another kind of
/// ref (`refs/B`, then `refs/heads/B`, … are tried in turn).
pub const RESERVED_BRANCH_PREFIXES: [&str; 4] = ["refs", "heads", "tags", "remotes"];

/// Why `name` is no ref npc hands to git (an option, a revision range, a
/// name git's rules refuse), if it is not.
pub fn ref_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("it is empty".to_string());
    }
    if name.len() > MAX_REF_BYTES {
        return Some(format!("it is longer than {MAX_REF_BYTES} bytes"));
    }
    if name.starts_with('-') {
        return Some("it starts with `-`".to_string());
    }
    if name
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c))
    {
        return Some("it holds a space, a control character or one of `~^:?*[\\`".to_string());
    }
    if name.contains("..") || name.contains("@{") || name.ends_with('.') || name.ends_with('/') {
        return Some("it holds `..` or `@{`, or ends with `.` or `/`".to_string());
    }
    None
}

/// Why `name` is no branch a run may make, if it is not: a
/// [`ref_name_problem`], or a name that reads as something besides one
/// branch (see the module docs).
pub fn branch_name_problem(name: &str) -> Option<String> {
    if let Some(problem) = ref_name_problem(name) {
        return Some(problem);
    }
    if name == "@" || name == "HEAD" || (!name.contains('/') && name.ends_with("_HEAD")) {
        return Some("it is one of git's own names (`@`, `HEAD`, `FETCH_HEAD`, …)".to_string());
    }
    let components: Vec<&str> = name.split('/').collect();
    if let Some(first) = components
        .first()
        .filter(|c| RESERVED_BRANCH_PREFIXES.contains(c))
    {
        return Some(format!(
            "it starts with `{first}/`, so git would read it as another ref (write the branch's name alone, such as `npc/fix`)"
        ));
    }
    if components.iter().any(|c| c.is_empty()) {
        return Some("it has an empty component (`//` or a leading `/`)".to_string());
    }
    if components
        .iter()
        .any(|c| c.starts_with('.') || c.ends_with(".lock"))
    {
        return Some("a component starts with `.` or ends with `.lock`".to_string());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_that_read_as_options_or_ranges_have_a_problem() {
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
            assert!(ref_name_problem(bad).is_some(), "{bad:?}");
            assert!(branch_name_problem(bad).is_some(), "{bad:?}");
        }
        for good in ["HEAD", "main", "npc/run-1", "refs/heads/x", "0123abcd", "@"] {
            assert_eq!(ref_name_problem(good), None, "{good:?}");
        }
        assert!(ref_name_problem(&"a".repeat(MAX_REF_BYTES + 1)).is_some());
    }

    #[test]
    fn branches_that_name_something_besides_one_branch_have_a_problem() {
        for bad in [
            "@",
            "HEAD",
            "FETCH_HEAD",
            "ORIG_HEAD",
            "refs/heads/main",
            "refs/tags/v1",
            "refs/x",
            "heads/main",
            "tags/v1",
            "remotes/origin/main",
            "/main",
            "a//b",
            ".hidden",
            "npc/.x",
            "main.lock",
            "npc/x.lock/y",
        ] {
            assert!(branch_name_problem(bad).is_some(), "{bad:?}");
        }
        for good in [
            "main",
            "npc/run-20261201t000000000z-0a1b2c3d",
            "feature/HEAD-less",
            "npc/HEAD",
            "review/42",
            "a@b",
            "x.locked",
        ] {
            assert_eq!(branch_name_problem(good), None, "{good:?}");
        }
    }
}
