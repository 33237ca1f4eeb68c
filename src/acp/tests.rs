//! Unit tests of `npc acp`: bounded sessions, fail-closed permission
//! questions, prompt text.

use super::prompt::prompt_text;
use super::*;

/// An agent over a real store in `dir`, writing its frames to the returned receiver.
fn agent(dir: &std::path::Path) -> (Arc<Agent>, mpsc::UnboundedReceiver<Value>) {
    agent_with(dir, |store| store)
}

/// One machine's store standing in for a fleet's: sessions it says are
/// shared.
#[derive(Debug)]
struct Fleetwide(Arc<Store>);

impl AcpSessions for Fleetwide {
    fn create(&self, session: AcpSession) -> crate::store::fleet::StoreFuture<'_, ()> {
        self.0.create(session)
    }
    fn add_run(&self, run: NewAcpRun) -> crate::store::fleet::StoreFuture<'_, ()> {
        self.0.add_run(run)
    }
    fn session<'a>(
        &'a self,
        id: &'a str,
    ) -> crate::store::fleet::StoreFuture<'a, Option<AcpSession>> {
        self.0.session(id)
    }
    fn sessions<'a>(
        &'a self,
        cwd: Option<&'a str>,
        before: Option<(i64, &'a str)>,
        limit: usize,
    ) -> crate::store::fleet::StoreFuture<'a, Vec<AcpSession>> {
        self.0.sessions(cwd, before, limit)
    }
    fn runs<'a>(
        &'a self,
        id: &'a str,
    ) -> crate::store::fleet::StoreFuture<'a, Vec<crate::store::acp::AcpSessionRun>> {
        self.0.runs(id)
    }
    fn agent_events<'a>(
        &'a self,
        run_id: &'a str,
    ) -> crate::store::fleet::StoreFuture<'a, Vec<crate::store::Event>> {
        self.0.agent_events(run_id)
    }
    fn keep_agent_events<'a>(
        &'a self,
        run_id: &'a str,
        events: Vec<crate::store::Event>,
    ) -> crate::store::fleet::StoreFuture<'a, ()> {
        self.0.keep_agent_events(run_id, events)
    }
    fn shared(&self) -> bool {
        true
    }
}

/// [`agent`] whose sessions live where `sessions` says.
fn agent_with(
    dir: &std::path::Path,
    sessions: impl FnOnce(Arc<Store>) -> Arc<dyn AcpSessions>,
) -> (Arc<Agent>, mpsc::UnboundedReceiver<Value>) {
    let text = "version = 1\n[providers.p]\nkind = \"claude_code\"\n\
                [profiles.dev]\nprovider = \"p\"\ndescription = \"d\"\n";
    let files = crate::disk::DiskFiles::new(dir.to_path_buf());
    let manifest = crate::model::load_bytes(
        "npcagent.toml",
        text.as_bytes(),
        crate::model::Syntax::Toml,
        &std::collections::BTreeMap::<String, String>::new(),
        &files,
    )
    .manifest
    .unwrap();
    let store = Arc::new(Store::open(dir.join("state.db")).unwrap());
    let (events, _) = mpsc::unbounded_channel();
    let supervisor = Supervisor::new(events, crate::supervisor::BackoffPolicy::default());
    let bus = EventBus::new(store.clone());
    let hooks = Arc::new(HookRunner::new(
        crate::hooks::HookSet::default(),
        supervisor.clone(),
        None,
    ));
    let (out, frames) = mpsc::unbounded_channel();
    let config = Config {
        profile: choose_profile(&manifest, None).unwrap(),
        manifest,
        root: dir.to_path_buf(),
        sessions: sessions(store.clone()),
        store,
        host: "test-host".into(),
        bus,
        supervisor,
        hooks,
        timeout: Duration::from_secs(5),
        daemon: None,
    };
    let agent = Agent {
        config,
        out,
        next_id: AtomicI64::new(1),
        pending: Mutex::new(HashMap::new()),
        sessions: Mutex::new(VecDeque::new()),
        approval_name: String::new(),
    };
    (Arc::new(agent), frames)
}

fn record(id: &str) -> AcpSession {
    AcpSession {
        id: id.into(),
        profile: "dev".into(),
        cwd: "/".into(),
        title: None,
        forked_from: None,
        created_at_ms: 0,
        updated_at_ms: 0,
    }
}

fn busy(session: &Session) {
    let (_tx, ended) = tokio::sync::watch::channel(false);
    *session.active.lock().unwrap() = Some(Active {
        cancel: None,
        ended,
    });
}

#[tokio::test]
async fn sessions_in_memory_are_bounded_dropping_idle_ones_first() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _frames) = agent(dir.path());
    let first = agent.hold(record("s0")).unwrap();
    busy(&first);
    for i in 1..MAX_SESSIONS {
        agent.hold(record(&format!("s{i}"))).unwrap();
    }
    // Full: the least recently used idle session (s1) makes room; the busy s0 stays.
    agent.hold(record("extra")).unwrap();
    let held: Vec<String> = agent
        .sessions
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.record.id.clone())
        .collect();
    assert_eq!(held.len(), MAX_SESSIONS);
    assert!(held.contains(&"s0".to_string()));
    assert!(!held.contains(&"s1".to_string()));
    // Every slot busy: refused, not grown.
    for s in agent.sessions.lock().unwrap().iter() {
        busy(s);
    }
    let e = agent.hold(record("one-too-many")).unwrap_err();
    assert_eq!(e["code"], BUSY);
    assert_eq!(agent.sessions.lock().unwrap().len(), MAX_SESSIONS);
}

#[tokio::test]
async fn permission_questions_fail_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, mut frames) = agent(dir.path());
    let request = ApprovalRequest {
        hook: "before_tool[0]".into(),
        reason: None,
        tool_call: crate::hooks::ToolCallInfo {
            id: "t".into(),
            name: "Bash".into(),
            arguments: json!({}),
        },
    };
    let denied = |a: Answer| matches!(a, Answer::Deny { .. });
    // No such session; a session with no prompt running.
    assert!(denied(agent.ask_permission("nope", request.clone()).await));
    let s = agent.hold(record("s")).unwrap();
    assert!(denied(agent.ask_permission("s", request.clone()).await));
    // Too many questions waiting: denied without asking.
    busy(&s);
    {
        let mut pending = agent.pending.lock().unwrap();
        for i in 0..MAX_PENDING_REQUESTS {
            pending.insert(1000 + i as i64, oneshot::channel().0);
        }
    }
    assert!(denied(agent.ask_permission("s", request.clone()).await));
    assert!(frames.try_recv().is_err(), "nothing was asked");
    agent.pending.lock().unwrap().clear();
    // Asked, then the prompt ends before an answer: denied.
    let (ended_tx, ended) = tokio::sync::watch::channel(false);
    *s.active.lock().unwrap() = Some(Active {
        cancel: None,
        ended,
    });
    let asking = tokio::spawn({
        let agent = agent.clone();
        async move { agent.ask_permission("s", request).await }
    });
    let asked = frames.recv().await.unwrap();
    assert_eq!(asked["method"], "session/request_permission");
    ended_tx.send(true).unwrap();
    assert!(denied(asking.await.unwrap()));
    assert!(agent.pending.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_fleets_sessions_keep_directories_relative_to_the_repository() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (local, _frames) = agent(root);
    assert_eq!(local.stored_cwd(root), root.display().to_string());
    let (fleet, _frames) = agent_with(root, |store| Arc::new(Fleetwide(store)));
    for (cwd, stored) in [
        (root.to_path_buf(), "."),
        (root.join("sub/dir"), "sub/dir"),
        (PathBuf::from("/elsewhere"), "/elsewhere"),
    ] {
        assert_eq!(fleet.stored_cwd(&cwd), stored);
        assert_eq!(fleet.local_cwd(stored), cwd);
    }
    // Listed by the directory as this machine names it.
    let id = fleet.create(root.join("sub"), None).await.unwrap();
    let request: ListSessionsRequest =
        serde_json::from_value(json!({ "cwd": root.join("sub") })).unwrap();
    let listed = fleet.list(request).await.unwrap();
    assert_eq!(listed["sessions"][0]["sessionId"], id.as_str());
    assert_eq!(
        listed["sessions"][0]["cwd"],
        root.join("sub").display().to_string()
    );
}

#[test]
fn prompt_text_joins_blocks_and_refuses_empty_or_huge_prompts() {
    let blocks: Vec<ContentBlock> = serde_json::from_value(json!([
        {"type":"text","text":"fix it"},
        {"type":"resource_link","name":"a.rs","uri":"file:///a.rs"},
        {"type":"resource","resource":{"uri":"file:///b.rs","text":"fn b() {}"}}
    ]))
    .unwrap();
    let text = prompt_text(&blocks).unwrap();
    assert!(text.starts_with("fix it"));
    assert!(text.contains("[a.rs](file:///a.rs)"));
    assert!(text.contains("fn b() {}"));
    assert!(prompt_text(&[]).is_err());
    let huge = vec![ContentBlock::from("x".repeat(MAX_PROMPT_BYTES + 1))];
    assert_eq!(prompt_text(&huge).unwrap_err()["code"], INVALID_PARAMS);
}
