//! One view of the fleet, against a real PostgreSQL and real `npc worker`
//! processes: `npc events --fleet` (and `--follow`) print every worker's
//! run events in the shared log's one order, `npc runs show --fleet` one
//! run of the fleet; the daemon's API answers the fleet's roster, runs and
//! events to a token holder (and says clearly when it is in no fleet); the
//! dashboard's Fleet panel in headless Chromium shows the roster and a
//! runs timeline with a lane per worker and each run's bar in its
//! outcome's colour.

use std::process::{Command, Stdio};
use std::sync::mpsc;

use npcagent::event::{Event, RunOutput};
use npcagent::store::NewEvent;
use npcagent::store::fleet::FleetQueue as _;
use npcagent::store::pg::PgStore;
use serde_json::{Value, json};

use crate::api::{ANONYMOUS, Api, api_addr, http, post_json};
use crate::fleet::{
    FAULT_LEASE_SECS, QueuedFleet, STEADY_LEASE_SECS, fleet_key, fleet_repo, npc_in, npc_json,
    queued_fleet, start_worker_leased, worker_logs, worker_store,
};
use crate::pg::{PG_PASSWORD, PgCluster};
use crate::support::{Daemon, DaemonSetup, Stopped, WAIT_LIMIT, wait_for};

/// Runs the follow test queues before its workers start.
const FOLLOWED_RUNS: usize = 2;
/// Workers that carry them out.
const FOLLOWED_WORKERS: usize = 2;

/// `npc events --fleet --follow --format json` in a repository: its
/// lines, each an event, arrive on a channel.
struct Follower {
    _child: Stopped,
    lines: mpsc::Receiver<String>,
    seen: Vec<Value>,
}

impl Follower {
    fn start(repo: &std::path::Path, url: &str) -> Self {
        let mut child = Command::new(crate::support::npc_path())
            .args(["events", "--fleet", "--follow", "--format", "json"])
            .current_dir(repo)
            .env("NPC_STORE_URL", url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = crate::support::line_channel(child.stdout.take().unwrap());
        Self {
            _child: Stopped::new(child),
            lines,
            seen: Vec::new(),
        }
    }

    /// Read lines until `done` holds of every event printed so far (or
    /// fail after [`WAIT_LIMIT`] without one).
    fn until(&mut self, what: &str, done: impl Fn(&[Value]) -> bool) -> &[Value] {
        let deadline = std::time::Instant::now() + WAIT_LIMIT;
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("timed out following the fleet's events for {what}"));
            self.seen.push(serde_json::from_str(&line).unwrap());
        }
        &self.seen
    }
}

fn ids(events: &[Value]) -> Vec<i64> {
    events.iter().map(|e| e["id"].as_i64().unwrap()).collect()
}

/// The kinds of run `id`'s events, in order.
fn kinds_of(events: &[Value], id: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["payload"]["run_id"] == id || e["component"] == format!("run.{id}"))
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect()
}

fn finished(events: &[Value], id: &str) -> bool {
    kinds_of(events, id).iter().any(|k| k == "run.finished")
}

#[test]
fn npc_events_fleet_prints_every_workers_run_events_in_one_order_and_follows_them() {
    let Some(fleet) = queued_fleet("echo \"$NPC_RUN_ID\" >> ran.log", FOLLOWED_RUNS) else {
        return;
    };
    let QueuedFleet {
        repo, url, logs, ..
    } = &fleet;
    // Nothing relayed yet: the queue's rows hold no events.
    let mut follower = Follower::start(repo.path(), url);
    let _workers: Vec<Stopped> = (0..FOLLOWED_WORKERS)
        .map(|i| {
            Stopped::new(start_worker_leased(
                repo.path(),
                url,
                &logs.path().join(format!("worker-{i}.log")),
                STEADY_LEASE_SECS,
            ))
        })
        .collect();
    let runs: Vec<String> = (0..FOLLOWED_RUNS).map(|i| format!("run-{i:05}")).collect();
    let followed = follower
        .until("every run's end", |seen| {
            runs.iter().all(|id| finished(seen, id))
        })
        .to_vec();
    let followed_ids = ids(&followed);
    assert!(
        followed_ids.windows(2).all(|w| w[0] < w[1]),
        "out of order or repeated: {followed_ids:?}\n{}",
        worker_logs(logs.path())
    );
    for id in &runs {
        let kinds = kinds_of(&followed, id);
        assert_eq!(
            kinds.first().map(String::as_str),
            Some("run.started"),
            "{kinds:?}"
        );
        assert_eq!(
            kinds.last().map(String::as_str),
            Some("run.finished"),
            "{kinds:?}"
        );
    }

    // The log read once: the same events in the same order, then the end.
    let out = npc_in(repo.path(), url, &["events", "--fleet", "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = *followed_ids.last().unwrap();
    let listed_ids: Vec<i64> = ids(&listed).into_iter().filter(|id| *id <= last).collect();
    assert_eq!(listed_ids, followed_ids);
    // `--since` starts after an id; the human form names kinds and runs.
    let since = followed_ids[followed_ids.len() / 2];
    let out = npc_in(
        repo.path(),
        url,
        &["events", "--fleet", "--since", &since.to_string()],
    );
    let human = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(human.contains("run.finished"), "{human}");
    assert!(
        human
            .lines()
            .all(|l| l.split_whitespace().next().unwrap().parse::<i64>().unwrap() > since),
        "{human}"
    );
    assert!(!human.contains(PG_PASSWORD));

    // One run of the fleet and its events from the shared store.
    let shown = npc_json(repo.path(), url, &["runs", "show", &runs[0], "--fleet"]);
    assert_eq!(shown["run"]["state"], "succeeded", "{shown}");
    assert!(
        shown["run"]["owner"]
            .as_str()
            .is_some_and(|o| o.contains('/'))
    );
    let shown_kinds: Vec<&str> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert_eq!(shown_kinds.last(), Some(&"run.finished"), "{shown}");
    // Worktrees are each machine's own.
    let out = npc_in(repo.path(), url, &["runs", "diff", &runs[0], "--fleet"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("where the run ran"));
}

/// A wait no poll ends within a test: only a notification does.
const NO_POLL: std::time::Duration = std::time::Duration::from_secs(3_600);

#[test]
fn a_follower_of_the_fleets_log_is_woken_by_the_append_itself() {
    let Some(fleet) = queued_fleet("true", 0) else {
        return;
    };
    let QueuedFleet { rt, store, url, .. } = &fleet;
    rt.block_on(async {
        let follower = PgStore::connect(url, &fleet_key()).await.unwrap();
        // The first wait ends once the follower listens (it says so, since
        // an append may have gone by unheard until then).
        tokio::time::timeout(WAIT_LIMIT, follower.wait_for_append(NO_POLL))
            .await
            .expect("the follower listens");
        store
            .append_events(vec![NewEvent::from(Event::RunOutput(RunOutput::default()))])
            .await
            .unwrap();
        tokio::time::timeout(WAIT_LIMIT, follower.wait_for_append(NO_POLL))
            .await
            .expect("the append's notification wakes the follower");
        let events = follower.wait_for_events(0, 10, NO_POLL).await.unwrap();
        assert_eq!(events.last().unwrap().kind, "run.output");
    });
}

#[test]
fn npc_events_fleet_without_a_store_url_says_what_to_add() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), "version = 1\n").unwrap();
    let out = crate::support::npc()
        .args(["events", "--fleet", "--follow"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("no `[store] url`"), "{said}");
}

/// A daemon with its API on a free port in front of a fleet whose trigger
/// `t` fails when its payload says `fail`, and one worker that carried out
/// a run of each kind fired through the API; a second worker that joined
/// after them and was killed (lost, its lease short).
struct FleetView {
    _cluster: PgCluster,
    repo: tempfile::TempDir,
    url: String,
    daemon: Daemon,
    api: Api,
    _worker: Stopped,
    logs: tempfile::TempDir,
    /// The worker that carried the runs out.
    worker: String,
    /// The killed worker.
    lost: String,
    ok: String,
    bad: String,
}

/// A repository of the fleet (`fleet_repo`) whose daemon's API listens on
/// a free port.
fn listening_fleet_repo(script: &str) -> tempfile::TempDir {
    let repo = fleet_repo(script);
    let manifest = repo.path().join("npcagent.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        format!("{text}[daemon]\nlisten = \"127.0.0.1:0\"\n"),
    )
    .unwrap();
    repo
}

/// The fleet's roster as the API answers it.
fn api_roster(api: &Api) -> Vec<Value> {
    let answer = http(api, "GET", "/api/v1/fleet/workers", &[]);
    assert_eq!(answer.status, 200);
    answer.json()["workers"].as_array().unwrap().clone()
}

fn fleet_view() -> Option<FleetView> {
    let cluster = PgCluster::start()?;
    let repo = listening_fleet_repo("case \"$NPC_TRIGGER_PAYLOAD\" in *fail*) exit 3;; esac");
    let url = worker_store(&cluster, repo.path());
    let daemon = Daemon::start_in_with(
        repo.path(),
        DaemonSetup {
            only_env: Some(&[("NPC_STORE_URL", url.as_str())]),
            ..DaemonSetup::default()
        },
    );
    let api = api_addr(&daemon);
    wait_for("the daemon to join the fleet", || {
        (http(&api, "GET", "/api/v1/fleet/workers", &[]).status == 200).then_some(())
    });
    let logs = tempfile::tempdir().unwrap();
    let worker = Stopped::new(start_worker_leased(
        repo.path(),
        &url,
        &logs.path().join("worker.log"),
        STEADY_LEASE_SECS,
    ));
    let fire = |payload: &str| {
        let answer = post_json(
            &api,
            "/api/v1/triggers/t/fire",
            &json!({ "payload": payload }).to_string(),
        );
        assert_eq!(answer.status, 202, "{}", daemon.log());
        answer.json()["run_id"].as_str().unwrap().to_string()
    };
    let ok = fire("pass");
    let bad = fire("fail");
    let runs = wait_for("both runs to end", || {
        let runs = http(&api, "GET", "/api/v1/fleet/runs", &[]).json()["runs"].clone();
        let ended = |id: &str| {
            runs.as_array()?
                .iter()
                .find(|r| r["id"] == id && r["finished_at_ms"].is_i64())
                .cloned()
        };
        Some((ended(&ok)?, ended(&bad)?))
    });
    let worker_id = runs.0["owner"].as_str().unwrap().to_string();
    // A second worker, after the runs: killed, it is lost once its short
    // lease passes.
    let second = Stopped::new(start_worker_leased(
        repo.path(),
        &url,
        &logs.path().join("second.log"),
        FAULT_LEASE_SECS,
    ));
    let lost = wait_for("the second worker on the roster", || {
        api_roster(&api)
            .iter()
            .find(|w| w["id"] != worker_id.as_str())
            .map(|w| w["id"].as_str().unwrap().to_string())
    });
    second.kill();
    wait_for("the killed worker to be lost", || {
        api_roster(&api)
            .iter()
            .any(|w| w["id"] == lost.as_str() && w["state"] == "lost")
            .then_some(())
    });
    Some(FleetView {
        _cluster: cluster,
        repo,
        url,
        daemon,
        api,
        _worker: worker,
        logs,
        worker: worker_id,
        lost,
        ok,
        bad,
    })
}

#[test]
fn the_api_answers_the_fleets_workers_runs_and_events_to_a_token_holder() {
    let Some(view) = fleet_view() else {
        return;
    };
    let FleetView {
        api,
        worker,
        lost,
        ok,
        bad,
        ..
    } = &view;
    for path in [
        "/api/v1/fleet/workers",
        "/api/v1/fleet/runs",
        "/api/v1/fleet/events",
    ] {
        assert_eq!(http(api, "GET", path, &[ANONYMOUS]).status, 401, "{path}");
    }
    let answer = http(api, "GET", "/api/v1/fleet/workers", &[]);
    let roster = answer.json();
    assert_eq!(roster["fleet"], fleet_key().as_str());
    let workers = roster["workers"].as_array().unwrap();
    let carrier = workers.iter().find(|w| w["id"] == worker.as_str()).unwrap();
    assert_eq!(carrier["state"], "alive", "{roster}");
    assert_eq!(carrier["version"], env!("CARGO_PKG_VERSION"));
    assert!(carrier["host"].as_str().is_some_and(|h| !h.is_empty()));
    let killed = workers.iter().find(|w| w["id"] == lost.as_str()).unwrap();
    assert_eq!(killed["state"], "lost", "{roster}");

    let answer = http(api, "GET", "/api/v1/fleet/runs", &[]);
    let page = answer.json();
    let now = page["now_ms"].as_i64().unwrap();
    let run = |id: &str| {
        page["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} in {page}"))
    };
    for (id, state) in [(ok, "succeeded"), (bad, "failed")] {
        let r = run(id);
        assert_eq!(r["state"], state, "{r}");
        assert_eq!(r["owner"], worker.as_str());
        assert_eq!(r["trigger"], "t");
        assert_eq!(r["origin"], "manual");
        let (queued, started, ended) = (
            r["enqueued_at_ms"].as_i64().unwrap(),
            r["started_at_ms"].as_i64().unwrap(),
            r["finished_at_ms"].as_i64().unwrap(),
        );
        assert!(queued <= started && started <= ended && ended <= now, "{r}");
    }
    // Newest first; `before` pages on.
    let newest = page["runs"][0]["id"].as_str().unwrap();
    assert_eq!(newest, bad.as_str());
    let older = http(
        api,
        "GET",
        &format!("/api/v1/fleet/runs?limit=1&before={newest}"),
        &[],
    )
    .json();
    assert_eq!(older["runs"][0]["id"], ok.as_str(), "{older}");
    assert_eq!(older["runs"].as_array().unwrap().len(), 1);

    // The shared log: the daemon's `run.queued`, then the worker's events.
    let events = http(
        api,
        "GET",
        &format!("/api/v1/fleet/events?run={ok}&limit=1000"),
        &[],
    )
    .json();
    let events = events["events"].as_array().unwrap().clone();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    let at = |kind: &str| kinds.iter().position(|k| *k == kind);
    assert!(
        matches!((at("run.queued"), at("run.finished")), (Some(q), Some(f)) if q < f),
        "{kinds:?}"
    );
    assert!(at("run.started").is_some(), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"run.finished"), "{kinds:?}");
    let all = http(api, "GET", "/api/v1/fleet/events?limit=1000", &[]).json();
    let all_ids = ids(all["events"].as_array().unwrap());
    assert!(all_ids.windows(2).all(|w| w[0] < w[1]), "{all_ids:?}");
    let first = http(api, "GET", "/api/v1/fleet/events?limit=1", &[]).json();
    assert_eq!(first["next_after"], all_ids[0]);
    let second = http(
        api,
        "GET",
        &format!("/api/v1/fleet/events?limit=1&after={}", all_ids[0]),
        &[],
    )
    .json();
    assert_eq!(second["events"][0]["id"], all_ids[1]);
    let everything = format!("{roster}{page}{all}");
    assert!(!everything.contains(PG_PASSWORD));
    assert!(!view.daemon.log().contains(PG_PASSWORD));
    let _ = (&view.repo, &view.url, &view.logs);
}

#[test]
fn a_daemon_in_no_fleet_answers_the_fleet_endpoints_404_and_one_cut_off_503() {
    let plain = Daemon::start("version = 1\n[daemon]\nlisten = \"127.0.0.1:0\"\n");
    let api = api_addr(&plain);
    for path in [
        "/api/v1/fleet/workers",
        "/api/v1/fleet/runs",
        "/api/v1/fleet/events",
    ] {
        let answer = http(&api, "GET", path, &[]);
        assert_eq!(answer.status, 404, "{path}");
        assert_eq!(answer.json()["error"]["code"], "fleet.none");
    }

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("postgres://npc:{PG_PASSWORD}@127.0.0.1:{port}/fleet");
    let repo = listening_fleet_repo("true");
    let cut_off = Daemon::start_in_with(
        repo.path(),
        DaemonSetup {
            only_env: Some(&[("NPC_STORE_URL", url.as_str())]),
            ..DaemonSetup::default()
        },
    );
    let api = api_addr(&cut_off);
    let answer = http(&api, "GET", "/api/v1/fleet/runs", &[]);
    assert_eq!(answer.status, 503);
    let body = answer.json();
    assert_eq!(body["error"]["code"], "store.unreachable", "{body}");
    assert!(!body.to_string().contains(PG_PASSWORD), "{body}");
    assert!(!body.to_string().contains(&port.to_string()), "{body}");
}

/// The Fleet panel in headless Chromium: the roster (the lost worker
/// shown lost), a timeline lane per worker, each run's bar in its
/// outcome's colour after its queued segment, a bar opening its run's
/// events; the screenshot is kept under `target/artifacts/`.
#[test]
fn the_dashboards_fleet_panel_shows_the_roster_and_a_runs_timeline_in_headless_chromium() {
    if !crate::api::browser_ready() {
        return;
    }
    let Some(view) = fleet_view() else {
        return;
    };
    let dashboard = npc_in(view.repo.path(), &view.url, &["dashboard"]);
    let url = String::from_utf8(dashboard.stdout).unwrap();
    assert!(url.contains("/#code="), "{url}");
    let seen = crate::api::browse(
        "fleet.py",
        &url,
        &[&view.worker, &view.lost, &view.ok, &view.bad],
        "dashboard-fleet.png",
    );
    assert_eq!(seen["csp_violations"], json!([]), "{seen}");
    let text = |key: &str| seen[key].as_str().unwrap_or_default().to_string();
    assert!(text("fleet_name").contains(&fleet_key()), "{seen}");
    assert!(text("worker_row").contains("alive"), "{seen}");
    assert!(
        text("worker_row").contains(env!("CARGO_PKG_VERSION")),
        "{seen}"
    );
    assert!(text("lost_row").contains("lost"), "{seen}");
    // One lane per worker, the lost one marked.
    let lanes = seen["lanes"].as_array().unwrap();
    assert_eq!(lanes.len(), 2, "{seen}");
    assert!(lanes.contains(&json!([view.worker, "alive"])), "{seen}");
    assert!(lanes.contains(&json!([view.lost, "lost"])), "{seen}");
    // Each finished run's bar in its worker's lane, in its outcome's colour.
    assert_eq!(seen["ok_bar"]["lane"], view.worker.as_str(), "{seen}");
    assert_eq!(seen["ok_bar"]["fill"], "rgb(46, 125, 50)", "{seen}");
    assert_eq!(seen["bad_bar"]["fill"], "rgb(198, 40, 40)", "{seen}");
    assert_eq!(seen["ok_bar"]["state"], "succeeded");
    assert_eq!(seen["bad_bar"]["state"], "failed");
    assert!(seen["queued_segments"].as_u64().unwrap() >= 2, "{seen}");
    assert!(text("ok_title").contains("queued"), "{seen}");
    // A bar opens its run: the shared log's events of that run.
    assert!(text("run_title").contains(&view.ok), "{seen}");
    assert!(text("run_outcome").contains("succeeded"), "{seen}");
    assert!(!seen.to_string().contains(PG_PASSWORD));
}
