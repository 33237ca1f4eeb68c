//! What a fleet shares besides runs, through the real binary and a real
//! PostgreSQL (`pg::PgCluster`): `npc acp`'s sessions — one checkout's
//! session is listed, replayed, resumed and forked by `npc acp` in
//! another checkout of the fleet (driven by the ACP Python SDK), and a
//! run recorded on another host starts a new provider conversation — and
//! the notice board: a pane's notice in one daemon of the fleet reaches
//! another daemon of it with its host, though they share no user-level
//! board.

use std::path::Path;

use serde_json::Value;

use crate::acp::{CLAUDE_SESSION, argv, client_with, kinds, python_sdk, record_argv, repo};
use crate::fleet::{FLEET_PROJECT, fleet_key, make_checkout, worker_store};
use crate::pg::{PG_PASSWORD, PgCluster};
use crate::support::{Daemon, DaemonSetup, wait_for};

/// Make the repository at `dir` a checkout of the fleet: its manifest
/// names the project and `[store] url`, its `origin` the fleet's remote.
fn join_fleet(dir: &Path) {
    let manifest = dir.join("npcagent.toml");
    let text = std::fs::read_to_string(&manifest).unwrap().replacen(
        "version = 1\n",
        &format!(
            "version = 1\n[project]\nname = \"{FLEET_PROJECT}\"\n[store]\nurl = \"${{NPC_STORE_URL}}\"\n"
        ),
        1,
    );
    std::fs::write(&manifest, text).unwrap();
    make_checkout(dir);
}

/// The sessions this checkout's own store holds (none, in a fleet).
fn local_sessions(dir: &Path) -> usize {
    let store = npcagent::store::Store::open_read_only(dir.join(".npc/state.db")).unwrap();
    store.acp_sessions(None, None, 100).unwrap().len()
}

/// The updates of `seen` that are not the command list, of session `id`.
fn session_updates<'a>(seen: &'a Value, key: &str, id: &str) -> Vec<&'a Value> {
    seen[key]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["sessionId"] == id)
        .map(|u| &u["update"])
        .filter(|u| u["sessionUpdate"] != "available_commands_update")
        .collect()
}

#[test]
fn an_acp_session_of_one_checkout_is_listed_loaded_and_forked_in_another() {
    if !python_sdk() {
        return;
    }
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let (a, b) = (repo(&[]), repo(&[]));
    join_fleet(a.path());
    join_fleet(b.path());
    let url = worker_store(&cluster, a.path());
    let env = [("NPC_STORE_URL", url.as_str())];
    let first = client_with(a.path(), "dev", "prompt", &["list the files"], &env);
    let id = first["session_id"].as_str().unwrap().to_string();
    assert_eq!(first["stop_reason"], "end_turn", "{first}");

    // Checkout B (another directory, as on another machine) records its
    // agent's arguments.
    let argv_file = record_argv(b.path());
    let seen = client_with(b.path(), "dev", "reload", &[&id], &env);
    let listed = seen["listed"]["sessions"].as_array().unwrap();
    let entry = listed
        .iter()
        .find(|s| s["sessionId"] == id.as_str())
        .unwrap_or_else(|| panic!("B lists A's session: {seen}"));
    assert_eq!(entry["title"], "list the files");
    // Its directory is B's checkout: kept relative to the repository.
    assert_eq!(
        std::path::PathBuf::from(entry["cwd"].as_str().unwrap()),
        b.path().to_path_buf()
    );
    let loaded = session_updates(&seen, "loaded", &id);
    assert_eq!(
        kinds(&loaded),
        [
            "user_message_chunk",
            "agent_message_chunk",
            "tool_call",
            "tool_call_update",
            "agent_message_chunk"
        ],
        "A's run replayed in B: {seen}"
    );
    // The fork's first prompt branches off the recorded conversation (the
    // same host: the provider's conversation is here).
    assert_eq!(seen["stop_reason"], "end_turn", "{seen}");
    let args = argv(&argv_file);
    assert_eq!(
        &args[..3],
        ["--resume", CLAUDE_SESSION, "--fork-session"],
        "{args:?}"
    );
    // Neither checkout's own store holds the sessions.
    assert_eq!(local_sessions(a.path()), 0);
    assert_eq!(local_sessions(b.path()), 0);

    // A run recorded on another host left its conversation there: a new
    // prompt starts a new one and says so.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .execute("UPDATE npc_acp_session_runs SET host = 'elsewhere'", &[])
            .await
            .unwrap();
    });
    std::fs::remove_file(&argv_file).unwrap();
    let again = client_with(b.path(), "dev", "reload", &[&id], &env);
    assert_eq!(again["stop_reason"], "end_turn", "{again}");
    let fork = again["fork"].as_str().unwrap();
    let said: String = session_updates(&again, "updates", fork)
        .iter()
        .filter_map(|u| u["content"]["text"].as_str())
        .collect();
    assert!(
        said.contains("conversation of the earlier prompts is on host elsewhere"),
        "{again}"
    );
    let args = argv(&argv_file);
    assert!(!args.iter().any(|a| a == "--resume"), "{args:?}");
    assert!(!again.to_string().contains(PG_PASSWORD));
}

#[test]
fn npc_acp_with_an_unreachable_fleet_store_says_so_without_the_password() {
    let a = repo(&[]);
    join_fleet(a.path());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("postgres://npc:{PG_PASSWORD}@127.0.0.1:{port}/fleet");
    let out = crate::support::npc()
        .args(["acp", "--profile", "dev"])
        .current_dir(a.path())
        .env("NPC_STORE_URL", &url)
        .write_stdin("")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("cannot reach the fleet's store"), "{text}");
    assert!(!text.contains(PG_PASSWORD), "{text}");
    assert!(out.stdout.is_empty(), "stdout is the protocol's");
}

/// A daemon on `root` of the fleet at `url`.
fn fleet_daemon(root: &Path, url: &str) -> Daemon {
    let daemon = Daemon::start_in_with(
        root,
        DaemonSetup {
            only_env: Some(&[("NPC_STORE_URL", url)]),
            ..DaemonSetup::default()
        },
    );
    daemon.wait_event(0, "store.connected");
    daemon
}

#[test]
fn a_panes_notice_reaches_another_daemon_of_the_fleet_with_its_host() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(
        a.path().join("npcagent.toml"),
        format!(
            "version = 1\n{}{}",
            crate::panes::scripted_plugin("rec", ""),
            crate::panes::recording_pane("one", "plugin = \"rec\"")
        ),
    )
    .unwrap();
    std::fs::write(b.path().join("npcagent.toml"), "version = 1\n").unwrap();
    join_fleet(a.path());
    join_fleet(b.path());
    let url = worker_store(&cluster, a.path());
    // Each daemon has a user-level board of its own (`XDG_DATA_HOME`):
    // only the fleet's board joins them.
    let da = fleet_daemon(a.path(), &url);
    let db = fleet_daemon(b.path(), &url);
    crate::panes::wait_received(&da, "rec", "pane_opened", |_| true);
    for daemon in [&da, &db] {
        wait_for("the daemon to relay the fleet's notices", || {
            daemon
                .log()
                .contains("relaying the notices of fleet")
                .then_some(())
        });
    }
    let (a_after, b_after) = (da.last_event_id(), db.last_event_id());
    crate::panes::plugin_sends(
        &da,
        "rec",
        r#"{"v":3,"cmd":"attention","token":"{token:one}","generation":{gen:one}}"#,
    );
    da.wait_event(a_after, "pane.notice");
    let notice = db.wait_event(b_after, "notice");
    let payload = &notice["payload"];
    assert_eq!(payload["repository"], a.path().display().to_string());
    assert_eq!(payload["pane"], "one");
    assert_eq!(payload["reason"], "attention");
    assert_eq!(payload["fleet"], fleet_key().as_str());
    assert_eq!(payload["host"], npcagent::runs::fleet::host_name().as_str());
    assert!(
        da.events_after(a_after)
            .iter()
            .all(|e| e["kind"] != "notice"),
        "a daemon hears its own notice back"
    );
}

// ----- trigger state in the fleet's store --------------------------------

/// A daemon of the fleet whose cron `nightly` has its next fire stored
/// in the shared store; removing the trigger forgets it there too, as on
/// one machine.
#[test]
fn a_cron_triggers_next_fire_lives_in_the_fleets_store_until_it_is_removed() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let with_cron = "version = 1\n[triggers.nightly]\nkind = \"cron\"\nschedule = \"0 3 * * *\"\n\
                     action = { command = \"true\" }\n";
    std::fs::write(dir.path().join("npcagent.toml"), with_cron).unwrap();
    join_fleet(dir.path());
    let url = worker_store(&cluster, dir.path());
    let daemon = fleet_daemon(dir.path(), &url);
    daemon.wait_event(0, "scheduler.leading");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt
        .block_on(npcagent::store::pg::PgStore::connect(&url, &fleet_key()))
        .unwrap();
    let key = npcagent::triggers::cron::STATE_KEY;
    let stored = wait_for("the next fire in the fleet's store", || {
        rt.block_on(store.trigger_values(key))
            .unwrap()
            .remove("nightly")
    });
    assert!(stored["next_fire_ms"].as_i64().is_some(), "{stored}");
    let manifest = std::fs::read_to_string(dir.path().join("npcagent.toml")).unwrap();
    let cut = manifest.find("[triggers.nightly]").unwrap();
    daemon.write_manifest(&manifest[..cut]);
    wait_for("the fleet to forget the removed trigger's state", || {
        (!rt.block_on(store.trigger_values(key))
            .unwrap()
            .contains_key("nightly"))
        .then_some(())
    });
}

/// The fleet's old runs are pruned as the embedded store prunes its own:
/// the dedupe keys of pruned webhook runs stay in the replay table for
/// their window, so a replay is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruned_runs_keep_their_webhook_replay_keys_in_the_fleets_store() {
    use npcagent::store::fleet::FleetQueue;
    use npcagent::store::queue::{Enqueued, NewRun};
    let Some(cluster) = tokio::task::spawn_blocking(PgCluster::start).await.unwrap() else {
        return;
    };
    let url = cluster.database("fleet");
    npcagent::store::pg::migrate(&url).await.unwrap();
    let store = npcagent::store::pg::PgStore::connect(&url, "f")
        .await
        .unwrap();
    let now = npcagent::store::now_ms();
    let delivery = |id: &str, key: &str, until: i64| NewRun {
        dedupe_key: Some(key.to_string()),
        replay_until_ms: Some(until),
        ..crate::fleet::run(id)
    };
    for run in [
        delivery("live", "sig-live", now + 3_600_000),
        delivery("expired", "sig-old", now - 1),
        crate::fleet::run("plain"),
    ] {
        assert_eq!(store.enqueue(run).await.unwrap(), Enqueued::Queued);
        let claimed = store
            .claim("w", std::time::Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
        store
            .finish(&claimed.lease, "succeeded", None, None)
            .await
            .unwrap();
    }
    assert!(store.prune(0).await.unwrap() >= 3);
    assert!(store.run_rows(None, 10).await.unwrap().is_empty());
    let again = store
        .enqueue(delivery("live-again", "sig-live", now + 3_600_000))
        .await
        .unwrap();
    assert_eq!(
        again,
        Enqueued::Duplicate,
        "the replay key outlives its run"
    );
    let old = store
        .enqueue(delivery("old-again", "sig-old", now + 3_600_000))
        .await
        .unwrap();
    assert_eq!(old, Enqueued::Queued, "an expired key is forgotten");
}
