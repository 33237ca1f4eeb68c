//! Tests of the ACP client: the four real agents' recorded conversations
//! (`fixtures/acp/recorded`, made against the scripted model) replayed
//! frame by frame, and hostile agents: bad frames, methods npc did not
//! offer, floods of questions and tool calls, refusals, other versions.

use super::*;
use crate::event::PermissionAnswer;

fn start() -> Start {
    Start {
        cwd: PathBuf::from("/repo"),
        prompt: "call the echo tool".to_string(),
        mcp_servers: vec![McpEntry::Stdio {
            name: "npc".to_string(),
            command: "npc".to_string(),
            args: vec!["mcp".to_string(), "serve".to_string()],
            env: vec![("NPC_RUN_ID".to_string(), "run-x".to_string())],
        }],
        resume: None,
        mode: None,
        model: None,
        tool_for_kind: Default::default(),
    }
}

/// The frames a step list sends, parsed.
fn sent(steps: &[Step]) -> Vec<Value> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Send(bytes) => Some(serde_json::from_slice(bytes).unwrap()),
            _ => None,
        })
        .collect()
}

fn events(steps: &[Step]) -> Vec<AgentEvent> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Event(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

fn line(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// A client past `initialize` and `session/new` (session `s1`), prompting.
fn prompting() -> Client {
    let mut c = Client::new(start());
    c.begin();
    c.feed(&line(
        &json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":{}}}),
    ));
    let steps = c.feed(&line(
        &json!({"jsonrpc":"2.0","id":2,"result":{"sessionId":"s1"}}),
    ));
    assert_eq!(sent(&steps)[0]["method"], "session/prompt");
    assert_eq!(c.phase(), Phase::Prompting);
    c
}

fn permission(id: i64, session: &str) -> Vec<u8> {
    line(
        &json!({"jsonrpc":"2.0","id":id,"method":"session/request_permission","params":{
            "sessionId": session,
            "toolCall": {"toolCallId": format!("c{id}"), "name": "Bash", "rawInput": {"command": "rm -rf /"}},
            "options": [
                {"optionId":"yes-always","name":"Always","kind":"allow_always"},
                {"optionId":"yes","name":"Yes","kind":"allow_once"},
                {"optionId":"no","name":"No","kind":"reject_once"}
            ]
        }}),
    )
}

/// Replay a recorded conversation: every frame the agent sent, in order;
/// each question answered `decision`. Returns every step.
fn replay(name: &str, mode: Option<&str>, decision: Decision) -> Vec<Step> {
    let path = format!(
        "{}/fixtures/acp/recorded/{name}.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let mut c = Client::new(Start {
        mode: mode.map(str::to_string),
        ..start()
    });
    let mut steps = c.begin();
    for l in text.lines() {
        let record: Value = serde_json::from_str(l).unwrap();
        if record["dir"] != "in" {
            continue;
        }
        let more = c.feed(&line(&record["frame"]));
        let asks: Vec<u64> = more
            .iter()
            .filter_map(|s| match s {
                Step::Permission(a) => Some(a.key),
                _ => None,
            })
            .collect();
        steps.extend(more);
        for key in asks {
            steps.extend(c.answer(key, decision));
        }
    }
    steps
}

#[test]
fn initialize_offers_no_fs_and_no_terminal() {
    let mut c = Client::new(start());
    let frames = sent(&c.begin());
    assert_eq!(frames[0]["method"], "initialize");
    let caps = &frames[0]["params"]["clientCapabilities"];
    assert_eq!(caps["fs"]["readTextFile"], false);
    assert_eq!(caps["fs"]["writeTextFile"], false);
    assert_eq!(caps["terminal"], false);
    assert_eq!(c.phase(), Phase::Initializing);
    // Then `session/new` with the run's server, `env` always present.
    let steps = c.feed(&line(
        &json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":{}}}),
    ));
    let new = &sent(&steps)[0];
    assert_eq!(new["method"], "session/new");
    assert_eq!(new["params"]["cwd"], "/repo");
    assert_eq!(new["params"]["mcpServers"][0]["name"], "npc");
    assert_eq!(
        new["params"]["mcpServers"][0]["env"][0]["name"],
        "NPC_RUN_ID"
    );
}

#[test]
fn the_four_recorded_turns_read_as_npc_s_events() {
    for (name, mode) in [
        ("claude-turn", Some("default")),
        ("codex-turn", None),
        ("gemini-turn", None),
        ("opencode-turn", None),
    ] {
        let steps = replay(name, mode, Decision::Allow);
        let evs = events(&steps);
        let call = evs
            .iter()
            .find_map(|e| match e {
                AgentEvent::ToolCall { name, .. } => Some(name.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{name}: no tool call in {evs:#?}"));
        assert!(call.contains("echo"), "{name}: {call}");
        assert!(
            evs.iter().any(|e| matches!(e, AgentEvent::ToolResult { output, is_error: false, .. } if output.contains("Echo:"))),
            "{name}: no echo result in {evs:#?}"
        );
        assert!(
            evs.iter().any(|e| matches!(e, AgentEvent::Message { .. })),
            "{name}: no message"
        );
        assert!(
            steps.contains(&Step::Ended(TurnEnd::EndTurn)),
            "{name}: the turn did not end: {steps:#?}"
        );
        assert!(
            !evs.iter().any(|e| matches!(e, AgentEvent::Error { .. })),
            "{name}: a complaint about a real agent: {evs:#?}"
        );
    }
}

#[test]
fn a_recorded_permission_is_denied_with_an_option_the_agent_offered() {
    for (name, mode) in [
        ("claude-permission", Some("default")),
        ("gemini-permission", None),
        ("opencode-permission", None),
        ("codex-permission", Some("read-only")),
    ] {
        let steps = replay(name, mode, Decision::Deny);
        let asked: Vec<&PermissionAsk> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Permission(a) => Some(a),
                _ => None,
            })
            .collect();
        assert!(!asked.is_empty(), "{name}: no question: {steps:#?}");
        let answered: Vec<&Answered> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Answered(a) => Some(a),
                _ => None,
            })
            .collect();
        assert_eq!(answered.len(), asked.len(), "{name}");
        for a in answered {
            assert_eq!(a.answer, PermissionAnswer::Denied, "{name}: {a:?}");
            let chosen = a.option_id.clone().unwrap();
            assert!(a.options.contains(&chosen), "{name}: {a:?}");
        }
        // The question names the CLI's own shell tool or its command.
        assert!(!asked[0].tool.is_empty(), "{name}");
    }
}

#[test]
fn a_question_picks_one_time_options_and_cancels_without_a_matching_one() {
    let mut c = prompting();
    let steps = c.feed(&permission(7, "s1"));
    let Step::Permission(ask) = &steps[0] else {
        panic!("{steps:?}")
    };
    assert_eq!(ask.tool, "Bash");
    assert_eq!(ask.arguments["command"], "rm -rf /");
    let answer = c.answer(ask.key, Decision::Allow);
    let frame = &sent(&answer)[0];
    assert_eq!(frame["id"], 7);
    assert_eq!(frame["result"]["outcome"]["outcome"], "selected");
    assert_eq!(frame["result"]["outcome"]["optionId"], "yes");
    // A question offering no reject option: a denial is `cancelled`.
    let only_allow = line(
        &json!({"jsonrpc":"2.0","id":8,"method":"session/request_permission","params":{
        "sessionId":"s1","toolCall":{"toolCallId":"c8"},
        "options":[{"optionId":"ok","name":"OK","kind":"allow_once"}]}}),
    );
    let steps = c.feed(&only_allow);
    let Step::Permission(ask) = &steps[0] else {
        panic!("{steps:?}")
    };
    let answer = c.answer(ask.key, Decision::Deny);
    assert_eq!(
        sent(&answer)[0]["result"]["outcome"]["outcome"],
        "cancelled"
    );
    // Answering twice sends nothing more.
    assert!(c.answer(ask.key, Decision::Allow).is_empty());
}

#[test]
fn questions_beyond_the_bound_or_of_another_session_are_cancelled_at_once() {
    let mut c = prompting();
    let mut asked = 0;
    for id in 0..(MAX_PENDING_PERMISSIONS as i64 + 5) {
        let steps = c.feed(&permission(100 + id, "s1"));
        match &steps[0] {
            Step::Permission(_) => asked += 1,
            Step::Send(bytes) => {
                let v: Value = serde_json::from_slice(bytes).unwrap();
                assert_eq!(v["result"]["outcome"]["outcome"], "cancelled");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(asked, MAX_PENDING_PERMISSIONS);
    assert_eq!(c.pending_permissions(), MAX_PENDING_PERMISSIONS);
    let steps = c.feed(&permission(999, "another-session"));
    assert_eq!(sent(&steps)[0]["result"]["outcome"]["outcome"], "cancelled");
    // Cancelling answers every pending one `cancelled` after `session/cancel`.
    let steps = c.cancel();
    let frames = sent(&steps);
    assert_eq!(frames[0]["method"], "session/cancel");
    assert_eq!(frames.len(), 1 + MAX_PENDING_PERMISSIONS);
    assert!(
        frames[1..]
            .iter()
            .all(|f| f["result"]["outcome"]["outcome"] == "cancelled")
    );
    assert_eq!(c.phase(), Phase::Cancelling);
    assert_eq!(c.pending_permissions(), 0);
    let end = c.feed(&line(
        &json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"cancelled"}}),
    ));
    assert!(end.contains(&Step::Ended(TurnEnd::Cancelled)));
}

#[test]
fn hostile_frames_get_errors_and_bounded_complaints() {
    let mut c = prompting();
    // Not JSON; not JSON-RPC; an answer to nothing npc asked.
    assert!(matches!(
        &events(&c.feed(b"{not json"))[0],
        AgentEvent::Error { .. }
    ));
    let steps = c.feed(br#"{"jsonrpc":"1.0","id":5,"method":"x"}"#);
    assert_eq!(sent(&steps)[0]["error"]["code"], jsonrpc::INVALID_REQUEST);
    assert!(!events(&c.feed(br#"{"jsonrpc":"2.0","id":77,"result":{}}"#)).is_empty());
    // A method npc did not offer: the protocol's error, not an answer.
    let steps = c.feed(
        br#"{"jsonrpc":"2.0","id":6,"method":"fs/read_text_file","params":{"path":"/etc/shadow"}}"#,
    );
    assert_eq!(sent(&steps)[0]["error"]["code"], jsonrpc::METHOD_NOT_FOUND);
    let steps = c.feed(br#"{"jsonrpc":"2.0","id":7,"method":"terminal/create","params":{}}"#);
    assert_eq!(sent(&steps)[0]["error"]["code"], jsonrpc::METHOD_NOT_FOUND);
    // Complaints stop at the bound; errors to requests still go out.
    let mut complaints = 5;
    for i in 0..100 {
        let steps = c.feed(format!("garbage {i}").as_bytes());
        complaints += events(&steps).len();
    }
    assert_eq!(complaints, MAX_COMPLAINTS);
    let steps = c.feed(br#"{"jsonrpc":"2.0","id":8,"method":"terminal/create","params":{}}"#);
    assert_eq!(sent(&steps).len(), 1);
    // Updates of another session, or unreadable, change nothing.
    let other = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"other",
        "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"forged"}}}});
    assert!(c.feed(&line(&other)).is_empty());
    assert_eq!(c.phase(), Phase::Prompting);
}

#[test]
fn floods_of_tool_calls_and_long_texts_stay_bounded() {
    let mut c = prompting();
    for i in 0..(MAX_TRACKED_TOOL_CALLS + 100) {
        let call = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1",
            "update":{"sessionUpdate":"tool_call","toolCallId":format!("t{i}"),"title":"x","name":"Read"}}});
        c.feed(&line(&call));
    }
    assert!(c.tools.len() <= MAX_TRACKED_TOOL_CALLS);
    let long = "a".repeat(map::MAX_TEXT_BYTES * 3);
    let chunk = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1",
        "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":long}}}});
    match &events(&c.feed(&line(&chunk)))[0] {
        AgentEvent::Message { text, delta: true } => assert_eq!(text.len(), map::MAX_TEXT_BYTES),
        other => panic!("{other:?}"),
    }
    let entries: Vec<Value> = (0..1000)
        .map(|i| json!({"content": format!("step {i}"), "priority": "low", "status": "pending"}))
        .collect();
    let plan = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1",
        "update":{"sessionUpdate":"plan","entries":entries}}});
    match &events(&c.feed(&line(&plan)))[0] {
        AgentEvent::Plan(p) => assert_eq!(p.entries.len(), map::MAX_LIST_ITEMS),
        other => panic!("{other:?}"),
    }
}

#[test]
fn refusals_and_other_versions_fail_the_conversation() {
    let mut c = Client::new(start());
    c.begin();
    let steps =
        c.feed(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"auth required"}}"#);
    assert!(matches!(
        &steps[0],
        Step::Failed(AcpFailure::Refused {
            method: "initialize",
            code: -32000,
            ..
        })
    ));
    assert_eq!(c.phase(), Phase::Done);
    let mut c = Client::new(start());
    c.begin();
    let steps = c.feed(br#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":2}}"#);
    assert!(
        matches!(&steps[0], Step::Failed(AcpFailure::Version { .. })),
        "{steps:?}"
    );
    // An answer of the wrong shape.
    let mut c = Client::new(start());
    c.begin();
    let steps = c.feed(br#"{"jsonrpc":"2.0","id":1,"result":"hello"}"#);
    assert!(
        matches!(&steps[0], Step::Failed(AcpFailure::BadAnswer { .. })),
        "{steps:?}"
    );
}

#[test]
fn a_session_is_resumed_or_loaded_where_the_agent_can_and_refused_where_not() {
    let resume = |caps: Value| {
        let mut c = Client::new(Start {
            resume: Some("old".to_string()),
            ..start()
        });
        c.begin();
        let init =
            json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":caps}});
        let steps = c.feed(&line(&init));
        (c, steps)
    };
    let (_, steps) = resume(json!({"sessionCapabilities":{"resume":{}}}));
    assert_eq!(sent(&steps)[0]["method"], "session/resume");
    let (mut c, steps) = resume(json!({"loadSession":true}));
    assert_eq!(sent(&steps)[0]["method"], "session/load");
    // The replayed history is not this run's.
    let replayed = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"old",
        "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"old words"}}}});
    assert!(c.feed(&line(&replayed)).is_empty());
    let steps = c.feed(br#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
    assert_eq!(sent(&steps)[0]["method"], "session/prompt");
    assert_eq!(sent(&steps)[0]["params"]["sessionId"], "old");
    let (_, steps) = resume(json!({}));
    assert!(
        matches!(&steps[0], Step::Failed(AcpFailure::CannotResume { .. })),
        "{steps:?}"
    );
}

#[test]
fn a_mode_is_set_only_when_the_agent_lists_it() {
    let open = |modes: Value| {
        let mut c = Client::new(Start {
            mode: Some("default".to_string()),
            ..start()
        });
        c.begin();
        c.feed(&line(
            &json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":{}}}),
        ));
        sent(&c.feed(&line(
            &json!({"jsonrpc":"2.0","id":2,"result":{"sessionId":"s","modes":modes}}),
        )))
    };
    let listed = open(
        json!({"currentModeId":"auto","availableModes":[{"id":"auto","name":"Auto"},{"id":"default","name":"Default"}]}),
    );
    assert_eq!(listed[0]["method"], "session/set_mode");
    assert_eq!(listed[0]["params"]["modeId"], "default");
    let unlisted =
        open(json!({"currentModeId":"auto","availableModes":[{"id":"auto","name":"Auto"}]}));
    assert_eq!(unlisted[0]["method"], "session/prompt");
    let already = open(
        json!({"currentModeId":"default","availableModes":[{"id":"default","name":"Default"}]}),
    );
    assert_eq!(already[0]["method"], "session/prompt");
}

/// The `session/new` answer claude-agent-acp 0.101.0 gave (recorded): its
/// modes and its config options, a `model` select among them.
fn recorded_session_answer(name: &str) -> Value {
    let path = format!(
        "{}/fixtures/acp/recorded/{name}.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["dir"] == "in" && r["frame"]["result"]["sessionId"].is_string())
        .unwrap()["frame"]
        .clone()
}

/// A client opening the recorded session with `mode` and `model`: what it
/// sent and reported after `session/new`, and the client to go on with.
fn open_recorded(mode: Option<&str>, model: Option<&str>) -> (Client, Vec<Step>) {
    let mut c = Client::new(Start {
        mode: mode.map(str::to_string),
        model: model.map(str::to_string),
        ..start()
    });
    c.begin();
    c.feed(&line(
        &json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":{}}}),
    ));
    let steps = c.feed(&line(&recorded_session_answer("claude-cancel")));
    (c, steps)
}

#[test]
fn a_profiles_model_is_set_through_the_model_option_the_agent_lists() {
    // Mode first, then the model, then the prompt: one request at a time.
    let (mut c, steps) = open_recorded(Some("default"), Some("sonnet"));
    assert_eq!(sent(&steps)[0]["method"], "session/set_mode");
    let steps = c.feed(&line(&json!({"jsonrpc":"2.0","id":3,"result":{}})));
    let set = &sent(&steps)[0];
    assert_eq!(set["method"], "session/set_config_option", "{set}");
    assert_eq!(set["params"]["configId"], "model");
    assert_eq!(set["params"]["value"], "sonnet");
    assert_eq!(
        set["params"]["sessionId"],
        "f92ae775-2c66-4e3c-9e00-ed25d37c5b1c"
    );
    let steps = c.feed(&line(
        &json!({"jsonrpc":"2.0","id":4,"result":{"configOptions":[]}}),
    ));
    assert_eq!(sent(&steps)[0]["method"], "session/prompt");
    assert!(
        events(&steps)
            .iter()
            .all(|e| !matches!(e, AgentEvent::Notice { .. }))
    );

    // The model the session already uses: nothing to set.
    let (_, steps) = open_recorded(None, Some("default"));
    assert_eq!(sent(&steps)[0]["method"], "session/prompt");
}

#[test]
fn a_model_the_agent_does_not_list_is_never_sent_and_a_notice_says_so() {
    let (_, steps) = open_recorded(None, Some("gpt-6\u{1b}[31m"));
    let frames = sent(&steps);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0]["method"], "session/prompt");
    let notice = events(&steps)
        .into_iter()
        .find_map(|e| match e {
            AgentEvent::Notice { text } => Some(text),
            _ => None,
        })
        .unwrap();
    assert!(notice.contains("is not one the agent offers"), "{notice}");
    assert!(
        notice.contains("`sonnet`") && notice.contains("`haiku`"),
        "{notice}"
    );
    assert!(notice.contains("current model `default`"), "{notice}");

    // No model option at all (Gemini CLI's answer has none).
    let mut c = Client::new(Start {
        model: Some("gemini-pro".to_string()),
        ..start()
    });
    c.begin();
    c.feed(&line(
        &json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":{}}}),
    ));
    let steps = c.feed(&line(
        &json!({"jsonrpc":"2.0","id":2,"result":{"sessionId":"s"}}),
    ));
    assert_eq!(sent(&steps)[0]["method"], "session/prompt");
    assert!(
        events(&steps).iter().any(
            |e| matches!(e, AgentEvent::Notice { text } if text.contains("lists no model option"))
        ),
        "{steps:?}"
    );
}

#[test]
fn a_refused_model_is_a_notice_and_the_turn_goes_on() {
    let (mut c, steps) = open_recorded(None, Some("haiku"));
    assert_eq!(sent(&steps)[0]["method"], "session/set_config_option");
    let steps = c.feed(&line(
        &json!({"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"model not available on this plan"}}),
    ));
    assert_eq!(sent(&steps)[0]["method"], "session/prompt");
    assert!(
        events(&steps).iter().any(|e| matches!(e, AgentEvent::Notice { text } if text.contains("refused the model") && text.contains("not available"))),
        "{steps:?}"
    );
}

#[test]
fn a_gemini_call_id_names_its_tool() {
    assert_eq!(
        map::gemini_tool_of_id("run_shell_command__run_shell_command_1796458513260_0"),
        Some("run_shell_command")
    );
    assert_eq!(
        map::gemini_tool_of_id("mcp_npc_everything__echo__mcp_npc_everything__echo_1796_0"),
        Some("mcp_npc_everything__echo")
    );
    assert_eq!(map::gemini_tool_of_id("toolu_abc"), None);
    assert_eq!(map::gemini_tool_of_id("a__b_c"), None);
    assert_eq!(map::gemini_tool_of_id("__"), None);
}
