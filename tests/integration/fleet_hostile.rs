//! Hostile rows in a fleet's shared PostgreSQL store, written straight
//! through SQL as anyone holding the store's URL could: the real `npc
//! worker` refuses every row whose origin a fleet never carries (`cli`,
//! `acp`, `file_watch`) or whose id, queue, trigger or attempts it cannot
//! vouch for, runs none of them and says why printably; and every reader
//! of the store (`npc workers`, `npc runs --fleet`, `npc events --fleet`,
//! `GET /api/v1/fleet/workers`, the daemon's relay of the fleet's notices)
//! answers bounded, printable text however large and whatever bytes the
//! rows hold.

use npcagent::store::fleet::FleetQueue as _;
use npcagent::store::pg::PgStore;
use npcagent::store::queue::{RunRow, state};
use npcagent::store::untrusted;
use serde_json::{Value, json};

use crate::api::{api_addr, http};
use crate::fleet::{QueuedFleet, STEADY_LEASE_SECS, fleet_key, queued_fleet, start_worker_leased};
use crate::support::{Daemon, DaemonSetup, Stopped, wait_for};

/// A field a hostile row fills: 10 MB of text with terminal escapes
/// (an OSC 52 clipboard write, a screen clear, a C1 CSI) in it.
fn flood() -> String {
    let mut text = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\u{9b}2J\r".to_string();
    text.push_str(&"A".repeat(10 * 1024 * 1024));
    text
}

/// A field of a hostile row an index holds (PostgreSQL indexes at most
/// 8 kB a row): 2 kB with the same escapes.
fn indexed() -> String {
    let mut text = "\x1b]52;c;cHduZWQ=\x07\u{9b}2J\r".to_string();
    text.push_str(&"B".repeat(2 * 1024));
    text
}

/// Whether `text` holds a control character a terminal acts on, raw or as
/// JSON escapes it (`\u001b`); printable text writes them as `\xNN`.
fn has_controls(text: &str) -> bool {
    text.chars().any(npcagent::stdx::term::escapes)
        || ["\\u001b", "\\u0007", "\\r", "\\u009b"]
            .iter()
            .any(|e| text.contains(e))
}

/// A client of `url`'s database, for the test's own SQL.
fn sql(rt: &tokio::runtime::Runtime, url: &str) -> tokio_postgres::Client {
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    })
}

/// Insert a queued run row of the test's fleet as another machine could.
fn insert_run(
    rt: &tokio::runtime::Runtime,
    client: &tokio_postgres::Client,
    (id, trigger, origin): (&str, &str, &str),
    payload: &Value,
    attempts: i32,
) {
    rt.block_on(client.execute(
        "INSERT INTO npc_runs (fleet, id, trigger, origin, payload, state, enqueued_at_ms,
         attempt, attempts)
         VALUES ($1, $2, $3, $4, $5, 'queued', 0, 1, $6)",
        &[
            &fleet_key(),
            &id,
            &trigger,
            &origin,
            &payload.to_string(),
            &attempts,
        ],
    ))
    .unwrap();
}

/// Run `id` of the fleet once it ended.
fn ended(rt: &tokio::runtime::Runtime, store: &PgStore, id: &str) -> RunRow {
    wait_for(&format!("run `{id}` to end"), || {
        rt.block_on(store.run(id))
            .unwrap()
            .filter(|r| !matches!(r.state.as_str(), state::QUEUED | state::RUNNING))
    })
}

#[test]
fn a_worker_refuses_rows_a_fleet_never_carries_and_runs_none_of_them() {
    let Some(fleet) = queued_fleet("echo \"$NPC_RUN_ID\" >> ran.log; pwd >> where.log", 0) else {
        return;
    };
    let QueuedFleet {
        repo,
        url,
        rt,
        store,
        logs,
        ..
    } = &fleet;
    let client = sql(rt, url);
    let elsewhere = tempfile::tempdir().unwrap();
    let local = json!({
        "profile": "p",
        "prompt": "touch pwned",
        "cwd": elsewhere.path(),
    });
    // Rows a fleet never carries, each naming the trigger the worker
    // would otherwise run, or a local front end's request with its own
    // working directory; then rows whose other fields are forged.
    let hostile: [(&str, &str, &str, Value, i32, &str); 8] = [
        (
            "run-cli",
            "t",
            "cli",
            local.clone(),
            1,
            "never goes to a fleet",
        ),
        (
            "run-cli-manual",
            "@manual",
            "cli",
            local.clone(),
            1,
            "never goes to a fleet",
        ),
        (
            "run-acp",
            "@manual",
            "acp",
            local.clone(),
            1,
            "never goes to a fleet",
        ),
        (
            "run-watch",
            "t",
            "file_watch",
            json!({}),
            1,
            "never goes to a fleet",
        ),
        (
            "run-escape",
            "t",
            "cron\x1b]52;c;cHduZWQ=\x07",
            json!({}),
            1,
            "never goes to a fleet",
        ),
        ("run-../../up", "t", "cron", json!({}), 1, "is not a run id"),
        (
            "run-manual-cron",
            "@manual",
            "cron",
            json!({}),
            1,
            "only runs started through the API",
        ),
        ("run-many", "t", "cron", json!({}), 1_000_000, "attempts"),
    ];
    for (id, trigger, origin, payload, attempts, _) in &hostile {
        insert_run(rt, &client, (id, trigger, origin), payload, *attempts);
    }
    insert_run(rt, &client, ("run-good", "t", "cron"), &json!({}), 1);
    let log = logs.path().join("worker.log");
    let _worker = Stopped::new(start_worker_leased(
        repo.path(),
        url,
        &log,
        STEADY_LEASE_SECS,
    ));
    let why = || std::fs::read_to_string(&log).unwrap_or_default();

    let good = ended(rt, store, "run-good");
    assert_eq!(good.state, state::SUCCEEDED, "{good:?}\n{}", why());
    for (id, _, _, _, _, says) in &hostile {
        let row = ended(rt, store, id);
        assert_eq!(row.state, state::FAILED, "{row:?}\n{}", why());
        let detail = row.detail.clone().unwrap_or_default();
        assert!(detail.contains(says), "{id}: {detail}");
        assert!(!has_controls(&detail), "{detail:?}");
        let events = rt.block_on(store.event_page(0, 1_000, None)).unwrap();
        assert!(
            events
                .iter()
                .any(|e| e.kind == "run.finished" && e.payload["error"] == detail.as_str()),
            "{id}: {events:?}"
        );
    }
    // Only the good run ran, in the worker's own checkout; nothing was
    // made where a row pointed.
    let ran = std::fs::read_to_string(repo.path().join("ran.log")).unwrap();
    assert_eq!(ran.lines().collect::<Vec<_>>(), ["run-good"], "{}", why());
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    // The log's own colours aside, no escape of a row reaches it raw.
    assert!(!why().contains("\x1b]52"), "{}", why());
}

/// Bytes a listing of the hostile rows may answer: every field at its
/// bound, escapes included, with room for the rest of the answer.
const LISTING_BOUND: usize = 64 * 1024;

#[test]
fn every_reader_of_the_shared_store_answers_bounded_printable_text() {
    let Some(fleet) = queued_fleet("true", 0) else {
        return;
    };
    let QueuedFleet { repo, url, rt, .. } = &fleet;
    let manifest = repo.path().join("npcagent.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        format!("{text}[daemon]\nlisten = \"127.0.0.1:0\"\n"),
    )
    .unwrap();
    let client = sql(rt, url);
    let big = flood();
    let key = indexed();
    rt.block_on(async {
        let fleet = fleet_key();
        client
            .execute(
                "INSERT INTO npc_workers (fleet, id, host, version, started_at_ms,
                 heartbeat_at_ms, lease_ms)
                 VALUES ($1, $2, $3, $3, npc_now_ms(), npc_now_ms(), 600000)",
                &[&fleet, &key, &big],
            )
            .await
            .unwrap();
        client
            .execute(
                "INSERT INTO npc_runs (fleet, id, trigger, origin, payload, state,
                 enqueued_at_ms, finished_at_ms, detail, result)
                 VALUES ($1, 'run-big', $2, $3, $4, 'failed', 0, 0, $3, $4)",
                &[&fleet, &key, &big, &json!({ "x": big }).to_string()],
            )
            .await
            .unwrap();
        for _ in 0..3 {
            client
                .execute(
                    "INSERT INTO npc_events (fleet, ts_ms, kind, component, payload)
                     VALUES ($1, 0, $2, $3, $4)",
                    &[
                        &fleet,
                        &big,
                        &key,
                        &json!({ "run_id": "run-big", "x": big }).to_string(),
                    ],
                )
                .await
                .unwrap();
        }
    });
    // The command line's views.
    for args in [
        vec!["workers"],
        vec!["workers", "--format", "json"],
        vec!["runs", "--fleet"],
        vec!["runs", "--fleet", "--format", "json"],
        vec!["events", "--fleet"],
        vec!["events", "--fleet", "--format", "json"],
    ] {
        let out = crate::fleet::npc_in(repo.path(), url, &args);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            said.len() < 4 * LISTING_BOUND,
            "{args:?}: {} bytes",
            said.len()
        );
        assert!(
            !has_controls(&said),
            "{args:?}: {}",
            &said[..said.len().min(500)]
        );
        assert!(said.contains("AAAA"), "{args:?}: {said}");
    }

    // A page of runs stops at its byte budget, however many rows it asked.
    const HEAVY_RUNS: i64 = 200;
    rt.block_on(client.execute(
        "INSERT INTO npc_runs (fleet, id, trigger, origin, payload, result, state,
         enqueued_at_ms, finished_at_ms)
         SELECT $1, 'run-heavy-' || g, 't', 'cron', $2, $2, 'succeeded', 0, 0
         FROM generate_series(1, $3::bigint) g",
        &[
            &fleet_key(),
            &json!({ "x": "x".repeat(60_000) }).to_string(),
            &HEAVY_RUNS,
        ],
    ))
    .unwrap();
    let out = crate::fleet::npc_in(
        repo.path(),
        url,
        &["runs", "--fleet", "--limit", "1000", "--format", "json"],
    );
    assert!(out.status.success());
    let listed = crate::triggers::json_of(&out)
        .as_array()
        .map_or(0, Vec::len);
    assert!(
        (1..HEAVY_RUNS as usize).contains(&listed),
        "{listed} runs listed"
    );
    assert!(
        out.stdout.len() < 2 * untrusted::MAX_PAGE_BYTES,
        "{} bytes",
        out.stdout.len()
    );

    // The daemon: its API's roster, and the fleet's notices it relays.
    let daemon = Daemon::start_in_with(
        repo.path(),
        DaemonSetup {
            only_env: Some(&[("NPC_STORE_URL", url.as_str())]),
            ..DaemonSetup::default()
        },
    );
    let api = api_addr(&daemon);
    let answer = wait_for("the daemon to join the fleet", || {
        let answer = http(&api, "GET", "/api/v1/fleet/workers", &[]);
        (answer.status == 200).then_some(answer)
    });
    let body = answer.json().to_string();
    assert!(body.len() < LISTING_BOUND, "{} bytes", body.len());
    assert!(!has_controls(&body), "{}", &body[..body.len().min(500)]);
    let worker = &answer.json()["workers"][0];
    let host = worker["host"].as_str().unwrap();
    assert!(host.starts_with("\\x1b]52;c;"), "{host}");
    assert!(
        host.chars().count() <= 4 * untrusted::MAX_NAME_CHARS,
        "{host}"
    );

    const NOTICES: usize = 20;
    let after = daemon.last_event_id();
    rt.block_on(async {
        for _ in 0..NOTICES {
            client
                .execute(
                    "INSERT INTO npc_notices (fleet, at_ms, host, repository, pane, plugin, reason)
                     VALUES ($1, 0, 'elsewhere', $2, $2, $2, $2)",
                    &[&fleet_key(), &big],
                )
                .await
                .unwrap();
        }
    });
    let notices = wait_for("the fleet's notices to be relayed", || {
        let notices: Vec<Value> = daemon
            .events_after(after)
            .into_iter()
            .filter(|e| e["kind"] == "notice")
            .collect();
        (notices.len() >= NOTICES).then_some(notices)
    });
    for notice in &notices {
        let payload = notice["payload"].to_string();
        assert!(
            payload.len() < 4 * npcagent::store::notices::MAX_FIELD_CHARS * 6,
            "{} bytes",
            payload.len()
        );
        assert!(!has_controls(&payload), "{payload}");
    }
}
