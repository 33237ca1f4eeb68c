//! Unit tests for the state store: migrations, WAL, read-only opening and
//! every table's round trip.

use super::*;
use serde_json::json;

fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Store::default_path(dir.path())).expect("open store");
    (dir, store)
}

fn event(kind: &str, n: i64) -> EncodedEvent {
    EncodedEvent::encode(NewEvent::untyped(kind, json!({ "n": n })).for_component("mcp_server/fs"))
}

fn raw(path: &Path) -> Connection {
    Connection::open(path).expect("raw connection")
}

#[test]
fn fresh_database_is_migrated_in_wal_mode() {
    let (_dir, store) = temp_store();
    assert!(store.path().ends_with(".npc/state.db"));
    let conn = raw(store.path());
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let versions: Vec<i64> = conn
        .prepare("SELECT version FROM schema_migrations ORDER BY version")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    for table in [
        "events",
        "manifests",
        "components",
        "managed_entries",
        "trigger_state",
    ] {
        let found: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(found, 1, "table {table}");
    }
}

/// Brief openers (`npc hook run`) never fold the WAL in at close, and with
/// no other connection SQLite reads the whole WAL at each open: the WAL
/// must stay near `WAL_CHECKPOINT_PAGES`, and every record kept.
#[test]
fn brief_openers_keep_the_wal_small_and_lose_no_record() {
    /// Brief opens, one record each: several checkpoints' worth.
    const OPENS: i64 = 150;
    /// Most pages one record's commit writes.
    const ONE_COMMIT_PAGES: u64 = 16;
    let dir = tempfile::tempdir().unwrap();
    let path = Store::default_path(dir.path());
    let mut wal = path.clone().into_os_string();
    wal.push("-wal");
    let mut largest = 0;
    for n in 1..=OPENS {
        let store = Store::open_brief(&path).unwrap();
        store
            .append_events(vec![event("hook.call", n)])
            .wait()
            .unwrap();
        drop(store);
        largest = largest.max(std::fs::metadata(&wal).unwrap().len());
    }
    // A commit that crosses the mark checkpoints after it: the WAL holds at
    // most the mark plus the pages of one commit (and SQLite's header).
    let bound = wal_bytes(WAL_CHECKPOINT_PAGES + ONE_COMMIT_PAGES);
    assert!(
        largest <= bound,
        "the WAL grew to {largest} bytes (bound {bound})"
    );
    let store = Store::open_read_only(&path).unwrap();
    let kept = store.events_since(0, OPENS as usize + 1).unwrap();
    assert_eq!(kept.len(), OPENS as usize, "every record kept");
}

#[test]
fn reopening_keeps_data_and_does_not_rerun_migrations() {
    let dir = tempfile::tempdir().unwrap();
    let path = Store::default_path(dir.path());
    {
        let store = Store::open(&path).unwrap();
        store.append_events(vec![event("a.b", 1)]).wait().unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.events_since(0, 10).unwrap().len(), 1);
    let rows: i64 = raw(&path)
        .query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, SCHEMA_VERSION);
}

#[test]
fn newer_schema_is_refused_by_both_openers() {
    let dir = tempfile::tempdir().unwrap();
    let path = Store::default_path(dir.path());
    drop(Store::open(&path).unwrap());
    raw(&path)
        .execute(
            "INSERT INTO schema_migrations (version, applied_at_ms) VALUES (?1, 0)",
            [SCHEMA_VERSION + 1],
        )
        .unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::SchemaTooNew { found, .. } if found == SCHEMA_VERSION + 1));
    assert!(err.to_string().contains("upgrade npc"), "{err}");
    let err = Store::open_read_only(&path).unwrap_err();
    assert!(matches!(err, StoreError::SchemaTooNew { .. }), "{err}");
}

#[test]
fn read_only_open_of_an_unmigrated_file_says_to_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    raw(&path).execute_batch("CREATE TABLE x (y)").unwrap();
    let err = Store::open_read_only(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::SchemaTooOld { found: 0, .. }),
        "{err}"
    );
}

#[test]
fn read_only_open_of_a_missing_file_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let err = Store::open_read_only(dir.path().join("nope.db")).unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }));
    assert!(err.to_string().contains("`npc daemon`"), "{err}");
}

#[test]
fn read_only_store_reads_beside_the_writer_and_refuses_writes() {
    let (_dir, store) = temp_store();
    store.append_events(vec![event("a.b", 1)]).wait().unwrap();
    let reader = Store::open_read_only(store.path()).unwrap();
    assert!(reader.is_read_only());
    assert_eq!(reader.events_since(0, 10).unwrap().len(), 1);
    // The writer keeps writing; the second opener sees new commits.
    store.append_events(vec![event("a.b", 2)]).wait().unwrap();
    assert_eq!(reader.last_event_id().unwrap(), 2);
    let err = reader
        .append_events(vec![event("a.b", 3)])
        .wait()
        .unwrap_err();
    assert!(matches!(err, StoreError::ReadOnly));
    let err = reader
        .set_managed_entries("x", BTreeSet::new())
        .wait()
        .unwrap_err();
    assert!(matches!(err, StoreError::ReadOnly));
}

#[test]
fn read_only_store_works_after_the_writer_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = Store::default_path(dir.path());
    {
        let store = Store::open(&path).unwrap();
        store.append_events(vec![event("a.b", 1)]).wait().unwrap();
    }
    let reader = Store::open_read_only(&path).unwrap();
    assert_eq!(
        reader.events_since(0, 10).unwrap()[0].payload,
        json!({"n": 1})
    );
}

#[test]
fn events_come_back_in_order_with_limits_and_cursor() {
    let (_dir, store) = temp_store();
    let stored = store
        .append_events((1..=5).map(|n| event("component.started", n)).collect())
        .wait()
        .unwrap();
    let ids: Vec<i64> = stored.iter().map(|e| e.id).collect();
    assert_eq!(ids, vec![1, 2, 3, 4, 5]);
    let page = store.events_since(2, 2).unwrap();
    assert_eq!(page.iter().map(|e| e.id).collect::<Vec<_>>(), vec![3, 4]);
    assert_eq!(page[0].kind, "component.started");
    assert_eq!(page[0].component.as_deref(), Some("mcp_server/fs"));
    assert_eq!(page[0].payload, json!({"n": 3}));
    assert_eq!(page[0], stored[2]);
    assert!(store.events_since(5, 10).unwrap().is_empty());
    assert_eq!(store.last_event_id().unwrap(), 5);
}

#[test]
fn events_since_is_a_primary_key_range_scan() {
    let (_dir, store) = temp_store();
    let plan: Vec<String> = raw(store.path())
        .prepare(
            "EXPLAIN QUERY PLAN SELECT id, ts_ms, kind, component, payload FROM events
             WHERE id > ?1 ORDER BY id LIMIT ?2",
        )
        .unwrap()
        .query_map((0, 10), |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("INTEGER PRIMARY KEY"), "{plan}");
}

#[test]
fn ids_are_never_reused_after_deletion() {
    let (_dir, store) = temp_store();
    store
        .append_events(vec![event("a.b", 1), event("a.b", 2)])
        .wait()
        .unwrap();
    raw(store.path()).execute("DELETE FROM events", []).unwrap();
    let again = store.append_events(vec![event("a.b", 3)]).wait().unwrap();
    assert_eq!(again[0].id, 3);
}

#[test]
fn a_failing_write_reports_the_error_and_stores_nothing() {
    let (_dir, store) = temp_store();
    store.fail_event_inserts(true).wait().unwrap();
    let err = store
        .append_events(vec![event("a.b", 1), event("a.b", 2)])
        .wait()
        .unwrap_err();
    assert!(err.to_string().contains("injected write failure"), "{err}");
    // Other writes still work, and the failed batch left no partial rows.
    store.fail_event_inserts(false).wait().unwrap();
    store.append_events(vec![event("a.b", 3)]).wait().unwrap();
    let payloads: Vec<_> = store
        .events_since(0, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.payload)
        .collect();
    assert_eq!(payloads, vec![json!({"n": 3})]);
}

#[test]
fn write_from_async_code_by_awaiting() {
    let (_dir, store) = temp_store();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let stored = rt
        .block_on(store.append_events(vec![event("a.b", 1)]))
        .unwrap();
    assert_eq!(stored[0].id, 1);
    assert_eq!(store.stats().transactions, 1);
    assert_eq!(store.stats().jobs, 1);
}

#[test]
fn cross_process_tail_returns_new_events_and_times_out_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = Store::default_path(dir.path());
    let writer = Store::open(&path).unwrap();
    let reader = Store::open_read_only(&path).unwrap();
    assert!(
        reader
            .wait_for_events_after(0, 10, Duration::from_millis(30))
            .unwrap()
            .is_empty()
    );
    let appender = std::thread::spawn(move || {
        writer.append_events(vec![event("a.b", 1)]).wait().unwrap();
        writer
    });
    let got = reader
        .wait_for_events_after(0, 10, Duration::from_secs(20))
        .unwrap();
    assert_eq!(got.len(), 1);
    drop(appender.join().unwrap());
}

#[test]
fn manifests_keep_a_bounded_history() {
    let (_dir, store) = temp_store();
    assert_eq!(store.last_manifest().unwrap(), None);
    for n in 0..MANIFEST_HISTORY_LIMIT + 5 {
        store
            .record_manifest(format!("hash-{n}"), format!("{{\"n\":{n}}}"))
            .wait()
            .unwrap();
    }
    let last = store.last_manifest().unwrap().unwrap();
    assert_eq!(last.hash, format!("hash-{}", MANIFEST_HISTORY_LIMIT + 4));
    assert_eq!(
        last.canonical,
        format!("{{\"n\":{}}}", MANIFEST_HISTORY_LIMIT + 4)
    );
    assert!(last.applied_at_ms > 0);
    let history = store.manifest_history(1000).unwrap();
    assert_eq!(history.len() as i64, MANIFEST_HISTORY_LIMIT);
    assert_eq!(history[0], last);
}

#[test]
fn component_rows_upsert_list_and_remove() {
    let (_dir, store) = temp_store();
    let mut fs = ComponentRecord {
        kind: "mcp_server".into(),
        name: "fs".into(),
        state: "running".into(),
        pid: Some(4242),
        restarts: 0,
        since_ms: 1_700_000_000_000,
        config_hash: Some("abc".into()),
        detail: None,
    };
    store.put_component(fs.clone()).wait().unwrap();
    fs.state = "backoff".into();
    fs.pid = None;
    fs.restarts = 3;
    fs.detail = Some("exit status 1".into());
    store.put_component(fs.clone()).wait().unwrap();
    let hook = ComponentRecord {
        kind: "hook".into(),
        name: "lint".into(),
        ..fs.clone()
    };
    store.put_component(hook.clone()).wait().unwrap();
    assert_eq!(
        store.component("mcp_server", "fs").unwrap(),
        Some(fs.clone())
    );
    assert_eq!(store.components().unwrap(), vec![hook, fs]);
    assert!(store.remove_component("hook", "lint").wait().unwrap());
    assert!(!store.remove_component("hook", "lint").wait().unwrap());
    assert_eq!(store.components().unwrap().len(), 1);
}

#[test]
fn managed_entries_replace_per_path() {
    let (_dir, store) = temp_store();
    let set = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    store
        .set_managed_entries(".mcp.json", set(&["fs", "git"]))
        .wait()
        .unwrap();
    store
        .set_managed_entries("opencode.json", set(&["fs"]))
        .wait()
        .unwrap();
    store
        .set_managed_entries(".mcp.json", set(&["git", "web"]))
        .wait()
        .unwrap();
    assert_eq!(
        store.managed_entries(".mcp.json").unwrap(),
        set(&["git", "web"])
    );
    assert_eq!(
        store.managed_entries("opencode.json").unwrap(),
        set(&["fs"])
    );
    store
        .set_managed_entries(".mcp.json", BTreeSet::new())
        .wait()
        .unwrap();
    assert!(store.managed_entries(".mcp.json").unwrap().is_empty());
}

#[test]
fn trigger_state_is_json_per_key() {
    let (_dir, store) = temp_store();
    store
        .set_trigger_value("nightly", "next_run_at", &json!("2026-12-01T00:00:00Z"))
        .wait()
        .unwrap();
    store
        .set_trigger_value("nightly", "last_fired_at", &json!(1_700_000_000_000_i64))
        .wait()
        .unwrap();
    store
        .set_trigger_value("nightly", "next_run_at", &json!("2026-12-02T00:00:00Z"))
        .wait()
        .unwrap();
    store
        .set_trigger_value("other", "k", &json!({"a": [1]}))
        .wait()
        .unwrap();
    let state = store.trigger_state("nightly").unwrap();
    assert_eq!(state.len(), 2);
    assert_eq!(state["next_run_at"], json!("2026-12-02T00:00:00Z"));
    assert_eq!(state["last_fired_at"], json!(1_700_000_000_000_i64));
    store.clear_trigger_state("nightly").wait().unwrap();
    assert!(store.trigger_state("nightly").unwrap().is_empty());
    assert_eq!(
        store.trigger_state("other").unwrap()["k"],
        json!({"a": [1]})
    );
}

#[test]
fn hostile_rows_written_by_others_are_reported_not_panicked() {
    let (_dir, store) = temp_store();
    raw(store.path())
        .execute(
            "INSERT INTO events (ts_ms, kind, component, payload) VALUES (0, 'x', NULL, '{not json')",
            [],
        )
        .unwrap();
    let err = store.events_since(0, 10).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Json {
                what: "event payload",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn open_reports_an_unusable_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let err = Store::open(file.join("state.db")).unwrap_err();
    assert!(matches!(err, StoreError::CreateDir { .. }), "{err}");
}

#[test]
fn continuations_run_in_commit_order_and_a_panicking_one_is_contained() {
    let (_dir, store) = temp_store();
    let (tx, rx) = std::sync::mpsc::channel();
    for n in 1..=3 {
        let tx = tx.clone();
        store.append_events_then(vec![event("a.b", n)], Commit::Now, move |stored| {
            let _ = tx.send(stored.map(|events| events[0].id));
        });
    }
    store.append_events_then(vec![event("a.b", 4)], Commit::Now, |_| {
        panic!("continuation exploded")
    });
    let later = store.append_events(vec![event("a.b", 5)]).wait().unwrap();
    let ids: Vec<i64> = rx.try_iter().map(Result::unwrap).collect();
    assert_eq!(ids, vec![1, 2, 3]);
    assert_eq!(later[0].id, 5, "the writer survived the panic");
}

#[test]
fn read_only_store_reports_continuations_as_read_only() {
    let (_dir, store) = temp_store();
    let reader = Store::open_read_only(store.path()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    reader.append_events_then(vec![event("a.b", 1)], Commit::Now, move |stored| {
        let _ = tx.send(stored.map(|_| ()));
    });
    assert!(matches!(rx.try_recv().unwrap(), Err(StoreError::ReadOnly)));
    assert!(matches!(reader.flush().wait(), Err(StoreError::ReadOnly)));
}

#[test]
fn lingering_events_share_a_transaction_and_an_awaited_write_ends_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("state.db")).unwrap();
    let before = store.stats().transactions;
    let (tx, rx) = std::sync::mpsc::channel();
    for n in 0..20 {
        let tx = tx.clone();
        store.append_events_then(vec![event("a.b", n)], Commit::MayLinger, move |stored| {
            tx.send(stored.is_ok()).unwrap();
        });
    }
    // An awaited write commits without waiting out the linger, and with it
    // every lingering event before it.
    store.flush().wait().unwrap();
    let done: Vec<bool> = rx.try_iter().collect();
    assert_eq!(done, vec![true; 20]);
    assert_eq!(store.events_since(0, 100).unwrap().len(), 20);
    // Twenty lingering events and the flush took far fewer transactions
    // than twenty-one.
    assert!(
        store.stats().transactions - before < 20,
        "{:?}",
        store.stats()
    );
}

#[tokio::test]
async fn approvals_are_answered_once_and_bounded() {
    use super::approvals::{
        Answer, AnswerRefused, MAX_ARGUMENTS_BYTES, MAX_PENDING_PER_RUN, NewApproval, Parked,
        call_fingerprint,
    };
    let (_dir, store) = temp_store();
    let run = "run-20261205t000000000z-0a0b0c0d";
    store
        .enqueue_run(queue::NewRun::new(
            run,
            queue::MANUAL_QUEUE,
            crate::model::RunOrigin::Cli,
            "{}",
        ))
        .await
        .unwrap();
    assert!(store.claim_run(run, None).await.unwrap());
    let new = |id: &str, arguments: serde_json::Value| NewApproval {
        id: id.into(),
        run_id: run.into(),
        profile: Some("dev".into()),
        tool: "Bash".into(),
        rule: "profile `dev` ask_tools".into(),
        reason: None,
        fingerprint: call_fingerprint("Bash", &arguments),
        arguments,
        deadline_ms: now_ms() + 60_000,
    };
    // Nothing pending: a running run waits for nothing, an unknown one is named.
    let refused = store
        .answer_approval(run, None, Answer::Allow { always: false }, "cli")
        .await
        .unwrap();
    assert!(
        matches!(refused, Err(AnswerRefused::NotWaiting { .. })),
        "{refused:?}"
    );
    let refused = store
        .answer_approval("run-nope", None, Answer::Allow { always: false }, "cli")
        .await
        .unwrap();
    assert!(
        matches!(refused, Err(AnswerRefused::NoRun { .. })),
        "{refused:?}"
    );
    // Parked: the run reads `waiting`; oversized arguments are stored as a marker.
    let big = json!({ "command": "x".repeat(MAX_ARGUMENTS_BYTES + 1) });
    assert_eq!(
        store.park_approval(new("ap-1", big)).await.unwrap(),
        Parked::Waiting
    );
    assert_eq!(
        store.run_row(run).unwrap().unwrap().state,
        queue::state::WAITING
    );
    let row = store.approval("ap-1").unwrap().unwrap();
    assert!(row.arguments["truncated_from_bytes"].as_u64().unwrap() > MAX_ARGUMENTS_BYTES as u64);
    // One answer wins; the second finds nothing pending.
    let answered = store
        .answer_approval(run, None, Answer::Allow { always: true }, "cli")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (answered.id.as_str(), answered.state.as_str()),
        ("ap-1", "allowed")
    );
    assert!(
        store
            .answer_approval(run, None, Answer::Deny { reason: None }, "api")
            .await
            .unwrap()
            .is_err()
    );
    assert_eq!(
        store.run_row(run).unwrap().unwrap().state,
        queue::state::RUNNING
    );
    // `--always`: the identical call is allowed without a row; another is parked.
    let same = json!({ "command": "x".repeat(MAX_ARGUMENTS_BYTES + 1) });
    assert_eq!(
        store.park_approval(new("ap-2", same)).await.unwrap(),
        Parked::AlwaysAllowed
    );
    // A timeout expires a pending row once; an answer after it is refused.
    assert_eq!(
        store
            .park_approval(new("ap-3", json!({"command": "ls"})))
            .await
            .unwrap(),
        Parked::Waiting
    );
    assert!(store.expire_approval("ap-3", "late".into()).await.unwrap());
    assert!(!store.expire_approval("ap-3", "late".into()).await.unwrap());
    // An answer naming the question a person saw: answered already (here
    // timed out), it never answers the next question instead.
    assert_eq!(
        store
            .park_approval(new("ap-4", json!({"command": "pwd"})))
            .await
            .unwrap(),
        Parked::Waiting
    );
    let named = |approval: &str| {
        store.answer_approval(
            run,
            Some(approval.to_string()),
            Answer::Allow { always: false },
            "cli",
        )
    };
    let refused = named("ap-3").await.unwrap();
    assert!(
        matches!(&refused, Err(AnswerRefused::AlreadyAnswered { state, .. }) if state == "timed_out"),
        "{refused:?}"
    );
    let refused = named("ap-nope").await.unwrap();
    assert!(
        matches!(refused, Err(AnswerRefused::NoApproval { .. })),
        "{refused:?}"
    );
    assert_eq!(named("ap-4").await.unwrap().unwrap().state, "allowed");
    // At most MAX_PENDING_PER_RUN wait at once.
    for i in 0..MAX_PENDING_PER_RUN {
        let parked = store
            .park_approval(new(&format!("ap-p{i}"), json!({ "i": i })))
            .await
            .unwrap();
        assert_eq!(parked, Parked::Waiting);
    }
    let over = store
        .park_approval(new("ap-over", json!({"i": "over"})))
        .await
        .unwrap();
    assert_eq!(over, Parked::TooMany);
    // An ended run is refused as ended, even with approvals left pending.
    store
        .mark_run(run, queue::state::SUCCEEDED, None)
        .await
        .unwrap();
    let refused = store
        .answer_approval(run, None, Answer::Allow { always: false }, "cli")
        .await
        .unwrap();
    assert!(
        matches!(refused, Err(AnswerRefused::Ended { .. })),
        "{refused:?}"
    );
}

#[tokio::test]
async fn workflow_runs_keep_their_journal_and_only_the_newest_finished_ones_stay() {
    use super::workflows::{StepRow, WorkflowRow, state};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("state.db")).unwrap();
    let row = |id: &str, at: i64, st: &str| WorkflowRow {
        id: id.into(),
        name: "ship".into(),
        origin: "cli".into(),
        inputs: json!({"goal": "x"}),
        payload: json!(null),
        state: st.into(),
        detail: None,
        created_at_ms: at,
        updated_at_ms: at,
        finished_at_ms: None,
    };
    for i in 0..5 {
        let st = if i == 0 {
            state::RUNNING
        } else {
            state::SUCCEEDED
        };
        store
            .create_workflow(row(&format!("wf-{i}"), i, st))
            .await
            .unwrap();
        let mut step = StepRow::new(&format!("wf-{i}"), "plan", 0, state::SUCCEEDED);
        step.outputs = Some(json!({"branch": "npc/x", "big": "y".repeat(10)}));
        store.put_steps(vec![step]).await.unwrap();
    }
    // A step's row is replaced, never doubled; an ended workflow stays ended.
    let mut again = StepRow::new("wf-1", "plan", 0, state::FAILED);
    again.detail = Some("x".into());
    store.put_steps(vec![again]).await.unwrap();
    assert_eq!(store.workflow_steps("wf-1").unwrap().len(), 1);
    assert_eq!(store.workflow_steps("wf-1").unwrap()[0].state, "failed");
    assert!(
        !store
            .set_workflow_state("wf-1", state::FAILED, None)
            .await
            .unwrap()
    );
    assert!(
        store
            .set_workflow_state("wf-0", state::CANCELLED, None)
            .await
            .unwrap()
    );
    assert!(
        store
            .workflow("wf-0")
            .unwrap()
            .unwrap()
            .finished_at_ms
            .is_some()
    );
    assert_eq!(store.workflows(true, 10).unwrap().len(), 0);
    // Two finished ones kept: the newest; the others' steps go too.
    assert_eq!(store.prune_workflows(2).await.unwrap(), 3);
    let left: Vec<String> = store
        .workflows(false, 10)
        .unwrap()
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(left, ["wf-4", "wf-3"]);
    assert!(store.workflow_steps("wf-1").unwrap().is_empty());
}

#[test]
fn a_steps_progress_is_the_newest_value_of_each_key_within_its_bound() {
    let (_dir, store) = temp_store();
    let report = |outputs: serde_json::Value| {
        EncodedEvent::encode(
            NewEvent::untyped(
                "run.progress",
                json!({ "run_id": "r1", "text": "t", "outputs": outputs }),
            )
            .for_component(super::queue::run_component("r1")),
        )
    };
    let big = "x".repeat(super::workflows::MAX_STEP_PROGRESS_BYTES / 2);
    store
        .append_events(vec![
            report(json!({ "a": 1, "b": "old" })),
            report(json!({ "b": "new", "c": big })),
            report(json!({ "d": big })),
        ])
        .wait()
        .unwrap();
    let progress = store.progress_of_run("r1").unwrap();
    // `d` (newest) and `b`'s newest value fit; `c` would pass the bound;
    // `a` still fits after it.
    assert_eq!(progress["b"], "new");
    assert_eq!(progress["a"], 1);
    assert!(progress.contains_key("d"));
    assert!(!progress.contains_key("c"), "{progress:?}");
    assert!(store.progress_of_run("other").unwrap().is_empty());
}
