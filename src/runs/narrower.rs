//! Whether one profile's policy is no broader than another's, for
//! `npc_delegate` (`Runs::start_delegated`): an agent may hand a task to a
//! profile that may do at most what it may itself. Decided on the
//! declarations, conservatively (patterns compared as written, never
//! interpreted): anything not shown to be narrower is broader.

use std::collections::BTreeSet;

use crate::hooks::policy::MCP_PATTERN_PREFIX;
use crate::model::{Manifest, Profile, SandboxMode, WorkspaceMode};

/// The first way profile `target` may do more than profile `asking`, in
/// words; `None` when it may do nothing `asking` may not (the same
/// provider, no server, allowed tool or looser sandbox more, every denial
/// and ask of `asking` kept, no checkout instead of a worktree, no push, no
/// file copied in that `asking` does not copy).
pub fn broader(manifest: &Manifest, target: &str, asking: &str) -> Option<String> {
    let (Some(t), Some(a)) = (manifest.profiles.get(target), manifest.profiles.get(asking)) else {
        return Some(format!("profile `{target}` or `{asking}` is not declared"));
    };
    if t.provider != a.provider {
        return Some(format!(
            "it runs provider `{}`, not `{}`",
            t.provider, a.provider
        ));
    }
    if let Some(server) = set(&t.mcp_servers).difference(&set(&a.mcp_servers)).next() {
        return Some(format!("it reaches MCP server `{server}`"));
    }
    let (t_mcp, t_own) = split_allowed(t);
    let (a_mcp, a_own) = split_allowed(a);
    // No MCP pattern in `allowed_tools` allows every gateway tool.
    if !a_mcp.is_empty() {
        if t_mcp.is_empty() {
            return Some("it allows every gateway tool".to_string());
        }
        if let Some(extra) = t_mcp.difference(&a_mcp).next() {
            return Some(format!("it allows `{extra}`"));
        }
    }
    if let Some(extra) = t_own.difference(&a_own).next() {
        return Some(format!("it pre-approves `{extra}`"));
    }
    let t_denied = set(&t.denied_tools);
    if let Some(kept) = set(&a.denied_tools).difference(&t_denied).next() {
        return Some(format!("it does not deny `{kept}`"));
    }
    let t_asks: BTreeSet<&str> = t_denied.union(&set(&t.ask_tools)).copied().collect();
    if let Some(kept) = set(&a.ask_tools).difference(&t_asks).next() {
        return Some(format!("it does not ask before `{kept}`"));
    }
    // Where it writes: in the checkout itself is more than a worktree (an
    // undeclared mode is the project's default, which may be the checkout).
    let place = |p: &Profile| p.workspace.mode.or(manifest.runs.workspace);
    if place(a) != place(t) && place(a) == Some(WorkspaceMode::Worktree) {
        return Some("its runs may work in the checkout, not in a worktree".to_string());
    }
    if t.workspace.push == Some(true) && a.workspace.push != Some(true) {
        return Some("it pushes its branch to `origin`".to_string());
    }
    if let Some(file) = set(&t.workspace.copy)
        .difference(&set(&a.workspace.copy))
        .next()
    {
        return Some(format!("it copies `{file}` into its worktree"));
    }
    let (t_box, a_box) = (sandbox(manifest, target), sandbox(manifest, asking));
    if rank(t_box) < rank(a_box) {
        return Some(format!(
            "its runs get sandbox `{}`, not `{}`",
            t_box.as_str(),
            a_box.as_str()
        ));
    }
    None
}

/// `names` as a set of strings.
fn set(names: &[String]) -> BTreeSet<&str> {
    names.iter().map(String::as_str).collect()
}

/// A profile's `allowed_tools`: the gateway's (MCP) patterns and the CLI's own.
fn split_allowed(p: &Profile) -> (BTreeSet<&str>, BTreeSet<&str>) {
    p.allowed_tools
        .iter()
        .map(String::as_str)
        .partition(|t| t.trim_start().starts_with(MCP_PATTERN_PREFIX))
}

/// The sandbox an unattended run of `profile` asks for (a delegated run is
/// one): its own, the project's, else the default `workspace`.
fn sandbox(manifest: &Manifest, profile: &str) -> SandboxMode {
    manifest
        .sandbox_mode(Some(profile), None)
        .unwrap_or(SandboxMode::Workspace)
}

fn rank(mode: SandboxMode) -> u8 {
    match mode {
        SandboxMode::Off => 0,
        SandboxMode::Workspace => 1,
        SandboxMode::Strict => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(profiles: &str) -> Manifest {
        let text = format!(
            "version = 1\n[mcp.servers.a]\ncommand = \"a\"\n[mcp.servers.b]\ncommand = \"b\"\n[providers.p]\nkind = \"claude_code\"\n[providers.q]\nkind = \"codex\"\n[profiles.asking]\nprovider = \"p\"\ndescription = \"d\"\nmcp_servers = [\"a\"]\nallowed_tools = [\"mcp__a__read\", \"Read\"]\ndenied_tools = [\"Write\"]\nask_tools = [\"Bash\"]\n{profiles}"
        );
        crate::runs::sandbox::tests::manifest(&text)
    }

    fn target(body: &str) -> Option<String> {
        let m = manifest(&format!(
            "[profiles.target]\nprovider = \"p\"\ndescription = \"d\"\n{body}"
        ));
        broader(&m, "target", "asking")
    }

    #[test]
    fn the_same_policy_or_a_narrower_one_is_no_broader() {
        let same = "mcp_servers = [\"a\"]\nallowed_tools = [\"mcp__a__read\", \"Read\"]\ndenied_tools = [\"Write\"]\nask_tools = [\"Bash\"]\n";
        assert_eq!(target(same), None);
        // Fewer servers and tools, more denied, an ask turned into a denial,
        // a stricter sandbox.
        let narrower = "mcp_servers = []\nallowed_tools = [\"mcp__a__read\"]\ndenied_tools = [\"Write\", \"Bash\", \"Edit\"]\nsandbox = \"strict\"\n";
        assert_eq!(target(narrower), None);
    }

    #[test]
    fn every_way_of_being_broader_is_named() {
        let base = "mcp_servers = [\"a\"]\nallowed_tools = [\"mcp__a__read\", \"Read\"]\ndenied_tools = [\"Write\"]\nask_tools = [\"Bash\"]\n";
        let with = |from: &str, to: &str| {
            assert_eq!(base.matches(from).count(), 1, "{from}");
            target(&base.replace(from, to)).unwrap_or_else(|| panic!("{to} is broader"))
        };
        assert!(with("mcp_servers = [\"a\"]", "mcp_servers = [\"a\", \"b\"]").contains("`b`"));
        assert!(
            with("\"mcp__a__read\", ", "").contains("every gateway tool"),
            "no MCP pattern allows them all"
        );
        assert!(with("\"mcp__a__read\"", "\"mcp__a__*\"").contains("`mcp__a__*`"));
        assert!(with("\"Read\"]", "\"Read\", \"Bash\"]").contains("pre-approves `Bash`"));
        assert!(with("denied_tools = [\"Write\"]", "denied_tools = []").contains("`Write`"));
        assert!(with("ask_tools = [\"Bash\"]", "ask_tools = []").contains("`Bash`"));
        assert!(with("ask_tools", "sandbox = \"off\"\nask_tools").contains("sandbox `off`"));
        assert!(with("ask_tools", "push = true\nask_tools").contains("pushes"));
        assert!(with("ask_tools", "copy = [\".env\"]\nask_tools").contains("`.env`"));
        // A worktree asking, an in-place target (set here: a worktree
        // needs a git repository to validate).
        let mut m = manifest(&format!(
            "[profiles.target]\nprovider = \"p\"\ndescription = \"d\"\n{base}workspace = \"in_place\"\n"
        ));
        m.profiles.get_mut("asking").unwrap().workspace.mode = Some(WorkspaceMode::Worktree);
        assert!(
            broader(&m, "target", "asking")
                .unwrap()
                .contains("checkout")
        );
        m.profiles.get_mut("target").unwrap().workspace.mode = Some(WorkspaceMode::Worktree);
        assert_eq!(broader(&m, "target", "asking"), None);
        let m = manifest("[profiles.target]\nprovider = \"q\"\ndescription = \"d\"\n");
        assert!(
            broader(&m, "target", "asking")
                .unwrap()
                .contains("provider `q`")
        );
        assert!(broader(&m, "nobody", "asking").is_some());
    }
}
