//! Unit tests of the hooks module: answer parsing, placeholder expansion,
//! set order and matching, plugin child specs, input clipping.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::exec::{
    BeforeAnswer, after_tool_answer, before_tool_answer, observer_answer, parse_stdout,
};
use super::*;
use crate::model::{CommandSpec, Text};

fn obj(v: Value) -> Option<Map<String, Value>> {
    v.as_object().cloned()
}

#[test]
fn stdout_is_nothing_or_one_object() {
    assert_eq!(parse_stdout(b"").unwrap(), None);
    assert_eq!(parse_stdout(b" \n\t").unwrap(), None);
    assert_eq!(parse_stdout(b"{}\n").unwrap(), Some(Map::new()));
    for bad in [&b"[]"[..], b"not json", b"{} {}", b"\"x\"", b"{\"a\":"] {
        assert!(
            parse_stdout(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn before_tool_answers() {
    assert_eq!(before_tool_answer(None).unwrap(), BeforeAnswer::Continue);
    assert_eq!(
        before_tool_answer(obj(json!({}))).unwrap(),
        BeforeAnswer::Continue
    );
    assert_eq!(
        before_tool_answer(obj(json!({"decision":"continue"}))).unwrap(),
        BeforeAnswer::Continue
    );
    assert_eq!(
        before_tool_answer(obj(json!({"decision":"deny","reason":"no"}))).unwrap(),
        BeforeAnswer::Deny {
            reason: "no".into()
        }
    );
    assert_eq!(
        before_tool_answer(obj(json!({"decision":"rewrite","arguments":{"a":1}}))).unwrap(),
        BeforeAnswer::Rewrite {
            arguments: obj(json!({"a":1})).unwrap()
        }
    );
    for bad in [
        json!({"decision":"deny"}),
        json!({"decision":"deny","reason":"  "}),
        json!({"decision":"rewrite"}),
        json!({"decision":"rewrite","arguments":[1]}),
        json!({"decision":"maybe"}),
        json!({"decision":"continue","arguments":{}}),
        json!({"decision":"continue","extra":1}),
        json!({"decision":7}),
    ] {
        let e = before_tool_answer(obj(bad.clone())).unwrap_err();
        assert!(matches!(e, HookError::InvalidOutput { .. }), "{bad}: {e}");
    }
}

#[test]
fn after_tool_and_observer_answers() {
    let a = after_tool_answer(obj(json!({"output":"x","is_error":true}))).unwrap();
    assert_eq!(a.output.as_deref(), Some("x"));
    assert_eq!(a.is_error, Some(true));
    let a = after_tool_answer(obj(json!({"output":{"k":1}}))).unwrap();
    assert_eq!(a.output.as_deref(), Some("{\"k\":1}"));
    assert!(after_tool_answer(obj(json!({"outputs":"x"}))).is_err());
    assert_eq!(
        after_tool_answer(obj(json!({"output":null})))
            .unwrap()
            .output,
        None
    );
    assert!(observer_answer(None).is_ok());
    assert!(observer_answer(obj(json!({}))).is_ok());
    assert!(observer_answer(obj(json!({"decision":"deny","reason":"x"}))).is_err());
}

fn hook(command: &str, args: &[&str], matcher: Option<&str>) -> Hook {
    Hook {
        run: CommandSpec {
            command: command.into(),
            args: args.iter().map(|a| Text::plain(*a)).collect(),
            env: BTreeMap::new(),
            cwd: None,
        },
        timeout_ms: 5_000,
        matcher: matcher.map(str::to_string),
    }
}

#[test]
fn sets_keep_source_order_and_match_tools() {
    let plugin = HookSource::Plugin {
        name: "p".into(),
        root: "/p".into(),
        data: "/d".into(),
    };
    let set = HookSet::build(
        Path::new("/repo"),
        &[
            SourceHooks {
                source: HookSource::Manifest,
                hooks: BTreeMap::from([(
                    HookEvent::BeforeTool,
                    vec![hook("a", &[], Some("^fs__")), hook("b", &[], None)],
                )]),
            },
            SourceHooks {
                source: plugin,
                hooks: BTreeMap::from([(HookEvent::BeforeTool, vec![hook("c", &[], None)])]),
            },
        ],
    );
    let names = |tool| {
        set.matching(HookEvent::BeforeTool, Some(tool))
            .map(HookEntry::label)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names("fs__read"),
        [
            "before_tool[0]",
            "before_tool[1]",
            "plugin `p` before_tool[0]"
        ]
    );
    assert_eq!(
        names("git__push"),
        ["before_tool[1]", "plugin `p` before_tool[0]"]
    );
    assert!(!set.has(HookEvent::AfterTool));
    assert_eq!(set.len(), 3);
}

#[test]
fn plugin_hooks_get_their_variables_and_a_confined_cwd() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pkg");
    let data = dir.path().join("data");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    let mut h = hook("./bin/h", &["${PLUGIN_DATA}/state"], None);
    h.run.env.insert("X".into(), Text::plain("${PLUGIN_ROOT}"));
    h.run.cwd = Some(Text::plain("${PLUGIN_ROOT}/sub"));
    let source = HookSource::Plugin {
        name: "p".into(),
        root: root.clone(),
        data: data.clone(),
    };
    let set = HookSet::build(
        dir.path(),
        &[SourceHooks {
            source: source.clone(),
            hooks: BTreeMap::from([(HookEvent::OnAgentStart, vec![h.clone()])]),
        }],
    );
    let entry = set.matching(HookEvent::OnAgentStart, None).next().unwrap();
    let spec = exec::child_spec(dir.path(), entry).unwrap();
    assert_eq!(spec.program, root.join("./bin/h").display().to_string());
    assert_eq!(spec.args, [format!("{}/state", data.display())]);
    assert_eq!(spec.env["X"], root.display().to_string());
    assert_eq!(spec.env[PLUGIN_ROOT_VAR], root.display().to_string());
    assert_eq!(spec.env[PLUGIN_DATA_VAR], data.display().to_string());
    assert_eq!(spec.cwd, root.join("sub"));

    h.run.cwd = Some(Text::plain("../"));
    let set = HookSet::build(
        dir.path(),
        &[SourceHooks {
            source,
            hooks: BTreeMap::from([(HookEvent::OnAgentStart, vec![h])]),
        }],
    );
    let entry = set.matching(HookEvent::OnAgentStart, None).next().unwrap();
    assert!(matches!(
        exec::child_spec(dir.path(), entry),
        Err(HookError::CwdOutside { .. })
    ));
}

#[test]
fn large_outputs_are_clipped_to_fit_the_input_bound() {
    let call = ToolCallInfo {
        id: "1".into(),
        name: "t".into(),
        arguments: json!({}),
    };
    let result = ToolResultInfo {
        call_id: "1".into(),
        tool_name: "t".into(),
        output: "\u{1}".repeat(3 * MAX_INPUT_BYTES),
        is_error: false,
    };
    let payload = after_tool_payload(&call, &result);
    assert_eq!(payload["result"]["output_truncated"], true);
    assert!(serde_json::to_vec(&payload).unwrap().len() <= MAX_INPUT_BYTES);
}

#[test]
fn an_ask_answer_carries_its_optional_reason() {
    assert_eq!(
        before_tool_answer(obj(json!({"decision":"ask","reason":"touches prod"}))).unwrap(),
        BeforeAnswer::Ask {
            reason: Some("touches prod".into())
        }
    );
    assert_eq!(
        before_tool_answer(obj(json!({"decision":"ask","reason":" "}))).unwrap(),
        BeforeAnswer::Ask { reason: None }
    );
    assert_eq!(
        before_tool_answer(obj(json!({"decision":"ask"}))).unwrap(),
        BeforeAnswer::Ask { reason: None }
    );
    assert!(before_tool_answer(obj(json!({"decision":"ask","arguments":{}}))).is_err());
}

/// An [`Approve`]r answering `answer` and remembering what it was asked.
#[derive(Debug)]
struct FixedApprover {
    answer: Approval,
    asked: std::sync::Mutex<Vec<ApprovalRequest>>,
}

impl Approve for FixedApprover {
    fn approve(&self, request: ApprovalRequest) -> futures_util::future::BoxFuture<'_, Approval> {
        self.asked.lock().unwrap().push(request);
        Box::pin(async move { self.answer.clone() })
    }
}

/// A runner whose one `before_tool` hook answers `answer` (a JSON text).
fn asking_runner(answer: &str) -> HookRunner {
    let hook = Hook {
        run: CommandSpec {
            command: "sh".into(),
            args: vec![
                Text::plain("-c"),
                Text::plain(format!("cat >/dev/null; echo '{answer}'")),
            ],
            env: BTreeMap::new(),
            cwd: None,
        },
        timeout_ms: 10_000,
        matcher: None,
    };
    let set = HookSet::build(
        Path::new("/"),
        &[SourceHooks {
            source: HookSource::Manifest,
            hooks: BTreeMap::from([(HookEvent::BeforeTool, vec![hook])]),
        }],
    );
    let (events, _) = tokio::sync::mpsc::unbounded_channel();
    let supervisor = Supervisor::new(events, crate::supervisor::BackoffPolicy::default());
    HookRunner::new(set, supervisor, None)
}

fn call() -> ToolCallInfo {
    ToolCallInfo {
        id: "c1".into(),
        name: "Bash".into(),
        arguments: json!({"command": "ls"}),
    }
}

#[tokio::test]
async fn an_ask_is_the_approvers_decision_and_denied_without_one() {
    let ask = r#"{"decision":"ask","reason":"runs a shell"}"#;
    let allow = Arc::new(FixedApprover {
        answer: Approval::Allow,
        asked: Default::default(),
    });
    let runner = asking_runner(ask).with_approver(allow.clone());
    assert_eq!(
        runner.before_tool(&call()).await.unwrap(),
        BeforeTool::Continue { arguments: None }
    );
    let asked = allow.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].reason.as_deref(), Some("runs a shell"));
    assert_eq!(asked[0].tool_call, call());
    assert_eq!(asked[0].hook, "before_tool[0]");

    let deny = Arc::new(FixedApprover {
        answer: Approval::Deny {
            reason: "not today".into(),
        },
        asked: Default::default(),
    });
    let runner = asking_runner(ask).with_approver(deny);
    assert_eq!(
        runner.before_tool(&call()).await.unwrap(),
        BeforeTool::Deny {
            hook: "before_tool[0]".into(),
            reason: "not today".into()
        }
    );

    // Nobody to ask: fail closed.
    let runner = asking_runner(ask);
    assert_eq!(
        runner.before_tool(&call()).await.unwrap(),
        BeforeTool::Deny {
            hook: "before_tool[0]".into(),
            reason: NO_APPROVER_REASON.into()
        }
    );
}

/// The policy of a profile `dev` with `ask_tools = patterns`.
fn policy(patterns: &[&str]) -> policy::ToolPolicy {
    let text = format!(
        "version = 1\n[providers.p]\nkind = \"claude_code\"\n[profiles.dev]\nprovider = \"p\"\ndescription = \"d\"\nask_tools = {}\n",
        serde_json::to_string(patterns).unwrap()
    );
    let files = crate::disk::DiskFiles::new(std::path::PathBuf::from("/"));
    let manifest = crate::model::load_bytes(
        "npcagent.toml",
        text.as_bytes(),
        crate::model::Syntax::Toml,
        &BTreeMap::<String, String>::new(),
        &files,
    )
    .manifest
    .unwrap();
    policy::ToolPolicy::for_profile(&manifest, "dev").unwrap()
}

#[tokio::test]
async fn ask_tools_ask_after_the_hooks_once_and_deny_without_an_approver() {
    let approver = || {
        Arc::new(FixedApprover {
            answer: Approval::Allow,
            asked: Default::default(),
        })
    };
    // The hooks let the call through (rewriting it); the policy asks about
    // the rewritten call.
    let rewrite = r#"{"decision":"rewrite","arguments":{"command":"ls -la"}}"#;
    let allow = approver();
    let runner = asking_runner(rewrite)
        .with_policy(policy(&["Bash(ls:*)"]))
        .with_approver(allow.clone());
    assert_eq!(
        runner.before_tool(&call()).await.unwrap(),
        BeforeTool::Continue {
            arguments: Some(json!({"command": "ls -la"}))
        }
    );
    let asked = allow.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].hook, "profile `dev` ask_tools");
    assert_eq!(asked[0].tool_call.arguments, json!({"command": "ls -la"}));
    // A hook that already asked: the user is not asked twice.
    let ask = r#"{"decision":"ask"}"#;
    let allow = approver();
    let runner = asking_runner(ask)
        .with_policy(policy(&["Bash"]))
        .with_approver(allow.clone());
    runner.before_tool(&call()).await.unwrap();
    assert_eq!(allow.asked.lock().unwrap().len(), 1);
    // A hook's deny wins before anyone is asked.
    let deny = r#"{"decision":"deny","reason":"no"}"#;
    let allow = approver();
    let runner = asking_runner(deny)
        .with_policy(policy(&["Bash"]))
        .with_approver(allow.clone());
    assert!(matches!(
        runner.before_tool(&call()).await.unwrap(),
        BeforeTool::Deny { .. }
    ));
    assert!(allow.asked.lock().unwrap().is_empty());
    // No match: nobody asked; nobody to ask: denied, naming `ask_tools`.
    let runner = asking_runner("{}").with_policy(policy(&["Edit", "Bash(git push:*)"]));
    assert_eq!(
        runner.before_tool(&call()).await.unwrap(),
        BeforeTool::Continue { arguments: None }
    );
    let runner = asking_runner("{}").with_policy(policy(&["Bash"]));
    match runner.before_tool(&call()).await.unwrap() {
        BeforeTool::Deny { hook, reason } => {
            assert_eq!(hook, "profile `dev` ask_tools");
            assert!(reason.contains("ask_tools") && reason.contains("nobody can be asked"));
        }
        other => panic!("{other:?}"),
    }
    assert!(runner.guards_tool("Bash"));
}

#[test]
fn matchers_meet_a_tool_however_the_agent_spells_it() {
    let set = HookSet::build(
        Path::new("/repo"),
        &[SourceHooks {
            source: HookSource::Manifest,
            hooks: BTreeMap::from([(
                HookEvent::BeforeTool,
                vec![
                    hook("a", &[], Some("get-env")),
                    hook("b", &[], Some("^mcp__my-server__get-env$")),
                    hook("c", &[], Some("^read_file$")),
                ],
            )]),
        }],
    );
    let names = |tool| {
        set.matching(HookEvent::BeforeTool, Some(tool))
            .map(HookEntry::label)
            .collect::<Vec<_>>()
    };
    // Codex's spelling of server-everything's `get-env` and a dashed server.
    assert_eq!(names("mcp__everything__get_env"), ["before_tool[0]"]);
    assert_eq!(
        names("mcp__my_server__get_env"),
        ["before_tool[0]", "before_tool[1]"]
    );
    assert_eq!(
        names("mcp__my-server__get-env"),
        ["before_tool[0]", "before_tool[1]"]
    );
    // Underscores the tool really has still match as written.
    assert_eq!(names("read_file"), ["before_tool[2]"]);
    assert!(names("shell__run").is_empty());
    assert_eq!(
        crate::model::pattern::dashed("mcp__a_b__c_d"),
        "mcp__a-b__c-d"
    );
}

/// A matcher the regex engine cannot build (too big; validation refuses
/// it, but a set can be built from anything) guards every tool instead of
/// none: a deny hook behind it fails closed.
#[test]
fn a_matcher_that_does_not_compile_matches_every_tool() {
    let set = HookSet::build(
        Path::new("/repo"),
        &[SourceHooks {
            source: HookSource::Manifest,
            hooks: BTreeMap::from([(
                HookEvent::BeforeTool,
                vec![
                    hook("a", &[], Some(r"\w{1000}{1000}")),
                    hook("b", &[], Some("^Bash$")),
                ],
            )]),
        }],
    );
    let names = |tool| {
        set.matching(HookEvent::BeforeTool, Some(tool))
            .map(HookEntry::label)
            .collect::<Vec<_>>()
    };
    assert_eq!(names("Read"), ["before_tool[0]"]);
    assert_eq!(names("Bash"), ["before_tool[0]", "before_tool[1]"]);
}

#[test]
fn a_profiles_denied_and_allowed_tools_refuse_gateway_calls() {
    let text = r#"version = 1
[providers.p]
kind = "claude_code"
[profiles.dev]
provider = "p"
description = "d"
allowed_tools = ["mcp__everything__*", "mcp__npc__board_read", "Bash(ls)"]
denied_tools = ["mcp__everything__get-env", "everything__echo(rm*)"]
"#;
    let files = crate::disk::DiskFiles::new(std::path::PathBuf::from("/"));
    let manifest = crate::model::load_bytes(
        "npcagent.toml",
        text.as_bytes(),
        crate::model::Syntax::Toml,
        &BTreeMap::<String, String>::new(),
        &files,
    )
    .manifest
    .unwrap();
    let policy = policy::ToolPolicy::for_profile(&manifest, "dev").unwrap();
    let call = |name: &str, arguments: serde_json::Value| ToolCallInfo {
        id: "1".into(),
        name: name.into(),
        arguments,
    };
    assert!(policy.may_refuse());
    assert!(policy.permits("everything__echo"));
    assert!(!policy.permits("everything__get-env"), "denied");
    assert!(
        !policy.permits("fs__read_file"),
        "not among the allowed MCP tools"
    );
    assert!(
        policy
            .refuses(&call("everything__echo", json!({})))
            .is_none()
    );
    let reason = policy
        .refuses(&call("everything__get-env", json!({})))
        .unwrap();
    assert!(reason.contains("denied_tools"), "{reason}");
    assert!(
        policy
            .refuses(&call("fs__read_file", json!({})))
            .unwrap()
            .contains("allowed_tools")
    );
    // A pattern with a subject refuses only the calls it matches.
    assert!(
        policy
            .refuses(&call("everything__echo", json!({"command": "rm -rf"})))
            .is_some()
    );
    // A built-in meets the patterns under the gateway's name for it too,
    // the same for listing and for calling.
    assert!(policy.permits("board_read"));
    assert!(policy.refuses(&call("board_read", json!({}))).is_none());
    assert!(!policy.permits("memory_write"));
    assert!(policy.refuses(&call("memory_write", json!({}))).is_some());
    let deny_builtin = text.replace(
        "denied_tools = [",
        "denied_tools = [\"mcp__npc__board_read\", ",
    );
    let manifest = crate::model::load_bytes(
        "npcagent.toml",
        deny_builtin.as_bytes(),
        crate::model::Syntax::Toml,
        &BTreeMap::<String, String>::new(),
        &files,
    )
    .manifest
    .unwrap();
    let policy = policy::ToolPolicy::for_profile(&manifest, "dev").unwrap();
    assert!(!policy.permits("board_read"));
    assert!(policy.refuses(&call("board_read", json!({}))).is_some());
}

mod literal_matchers {
    use super::super::{Literals, Matcher};
    use proptest::prelude::*;

    #[test]
    fn plain_names_skip_the_regex_and_anything_else_keeps_it() {
        for plain in [
            "Bash",
            "^Bash",
            "Edit|Write",
            "^mcp__fs__read$",
            "get-env",
            "",
        ] {
            assert!(Literals::parse(plain).is_some(), "{plain}");
        }
        for regex in [
            "mcp__.*",
            "^(Edit|Write)$",
            "a^b",
            "(?i)bash",
            "Bash\\b",
            "[ab]",
        ] {
            assert!(Literals::parse(regex).is_none(), "{regex}");
        }
        let m = Matcher::new("^Bash|Write$");
        assert!(m.is_match("BashOutput"));
        assert!(m.is_match("NotebookWrite"));
        assert!(!m.is_match("MyBash"));
    }

    proptest! {
        /// Where a matcher is read as literal branches, it matches exactly
        /// the tools its regular expression does.
        #[test]
        fn literal_branches_match_as_their_regex(
            pattern in "[ab_^$|-]{0,8}",
            tool in "[ab_-]{0,8}",
        ) {
            if let Some(literals) = Literals::parse(&pattern) {
                let re = regex::Regex::new(&pattern).unwrap();
                prop_assert_eq!(literals.is_match(&tool), re.is_match(&tool), "{:?} on {:?}", pattern, tool);
            }
        }
    }
}
