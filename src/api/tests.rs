//! Every endpoint through `tower::ServiceExt::oneshot` against a fake
//! backend over a real store and bus.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::*;
use crate::store::NewEvent;
use crate::surfaces::tcp::Access;

#[derive(Debug)]
struct Fake {
    store: Arc<Store>,
    bus: EventBus,
    plan: Mutex<Answer>,
    applied: Mutex<Vec<&'static str>>,
    /// The one configured pane, `shell`: open or not, its size, what was typed.
    pane: Mutex<FakePane>,
    output: tokio::sync::broadcast::Sender<Arc<[u8]>>,
    fired: Mutex<Vec<(String, Value)>>,
    /// What each `fleet_runs` was asked: limit, before.
    fleet_runs_asked: Mutex<Vec<(usize, Option<String>)>>,
}

#[derive(Debug)]
struct FakePane {
    open: bool,
    rows: u16,
    cols: u16,
    typed: Vec<u8>,
}

/// Capacity of the fake pane's output broadcast (small, so a client lags).
const FAKE_OUTPUT_QUEUE: usize = 8;

impl ApiBackend for Fake {
    fn status(&self) -> BoxFuture<'_, Value> {
        Box::pin(async { json!({ "pid": 7, "components": [] }) })
    }
    fn plan(&self) -> BoxFuture<'_, Answer> {
        Box::pin(async { self.plan.lock().unwrap().clone() })
    }
    fn apply(&self, reason: &'static str) -> BoxFuture<'_, Answer> {
        Box::pin(async move {
            self.applied.lock().unwrap().push(reason);
            self.plan.lock().unwrap().clone()
        })
    }
    fn store(&self) -> Arc<Store> {
        self.store.clone()
    }
    fn bus(&self) -> EventBus {
        self.bus.clone()
    }
    fn start_run(&self, run: ManualRun) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async move {
            if run.profile != "reviewer" {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "run.invalid",
                    "no profile",
                ));
            }
            let id = crate::runs::new_run_id();
            self.store
                .enqueue_run(crate::store::queue::NewRun::new(
                    &id,
                    crate::runs::MANUAL_QUEUE,
                    crate::model::RunOrigin::Api,
                    serde_json::to_string(&run).unwrap(),
                ))
                .await
                .unwrap();
            self.bus
                .publish(
                    NewEvent::untyped("run.queued", json!({ "run_id": id }))
                        .for_component(crate::runs::component(&id)),
                )
                .await
                .unwrap();
            Ok(id)
        })
    }
    fn run_diff(&self, id: String) -> BoxFuture<'_, Result<resources::RunDiff, ApiError>> {
        Box::pin(async move { Err(resources::run_not_found(&id)) })
    }
    fn answer_run(
        &self,
        id: String,
        _approval: Option<String>,
        _answer: crate::store::approvals::Answer,
    ) -> BoxFuture<'_, Result<resources::RunAnswered, ApiError>> {
        Box::pin(async move { Err(resources::run_not_found(&id)) })
    }
    fn cancel_run(&self, id: String) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async move {
            let state = crate::store::queue::state::CANCELLED;
            match self.store.run_row(&id).unwrap() {
                None => Err(resources::run_not_found(&id)),
                Some(row) if row.state == "queued" => {
                    self.store.mark_run(&id, state, None).await.unwrap();
                    Ok(state.to_string())
                }
                Some(row) => Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "run.finished",
                    format!("ended `{}`", row.state),
                )),
            }
        })
    }
    fn panes(&self) -> Vec<PaneView> {
        let pane = self.pane.lock().unwrap();
        vec![PaneView {
            name: "shell".into(),
            id: pane.open.then_some(1),
            generation: pane.open.then_some(1),
            state: if pane.open { "running" } else { "closed" }.into(),
            pid: None,
            cols: pane.cols,
            rows: pane.rows,
            exit: None,
            status: None,
            attention: false,
        }]
    }
    fn pane(&self, name: String, op: PaneOp) -> BoxFuture<'_, Result<PaneAnswer, ApiError>> {
        Box::pin(async move {
            use crate::panes::PaneError;
            use resources::pane_error;
            if name != "shell" {
                return Err(pane_error(PaneError::Unknown(name)));
            }
            let mut pane = self.pane.lock().unwrap();
            let mut answer = PaneAnswer {
                name: name.clone(),
                sent: None,
                pane: None,
            };
            match op {
                PaneOp::Open if pane.open => return Err(pane_error(PaneError::AlreadyOpen(name))),
                PaneOp::Open => pane.open = true,
                _ if !pane.open => return Err(pane_error(PaneError::NotOpen(name))),
                PaneOp::Input(bytes) => {
                    // A terminal echoes what is typed.
                    answer.sent = Some(bytes.len());
                    pane.typed.extend(&bytes);
                    let _ = self.output.send(Arc::from(&bytes[..]));
                }
                PaneOp::Resize { rows, cols } => (pane.rows, pane.cols) = (rows, cols),
                PaneOp::Close => pane.open = false,
            }
            Ok(answer)
        })
    }
    fn terminal(&self, name: &str) -> Result<Terminal, ApiError> {
        use crate::panes::PaneError;
        use resources::pane_error;
        if name != "shell" {
            return Err(pane_error(PaneError::Unknown(name.into())));
        }
        if !self.pane.lock().unwrap().open {
            return Err(pane_error(PaneError::NotOpen(name.into())));
        }
        Ok(Terminal {
            scrollback: b"scrollback$ ".to_vec(),
            output: self.output.subscribe(),
            status: Some(json!({ "state": "working" })),
            exit: Box::new(|| Some(json!({ "code": 0 }))),
        })
    }
    fn triggers(&self) -> BoxFuture<'_, Result<Vec<Value>, ApiError>> {
        Box::pin(async { Ok(vec![json!({ "name": "nightly", "kind": "cron" })]) })
    }
    fn fire(&self, name: String, payload: Value) -> BoxFuture<'_, Result<FireAccepted, ApiError>> {
        Box::pin(async move {
            if name != "nightly" {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "trigger.not_found",
                    "no trigger",
                ));
            }
            self.fired.lock().unwrap().push((name, payload));
            Ok(FireAccepted {
                run_id: "run-fired".into(),
                outcome: "queued".into(),
            })
        })
    }
    fn plugins(&self) -> BoxFuture<'_, Result<Vec<PluginRow>, ApiError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn fleet_runs(
        &self,
        limit: usize,
        before: Option<String>,
    ) -> BoxFuture<'_, Result<fleet::FleetRuns, ApiError>> {
        self.fleet_runs_asked.lock().unwrap().push((limit, before));
        Box::pin(async {
            Ok(fleet::FleetRuns {
                fleet: "fleet".into(),
                now_ms: 1,
                runs: Vec::new(),
            })
        })
    }
    fn fleet_events(
        &self,
        after: i64,
        limit: usize,
        run: Option<String>,
    ) -> BoxFuture<'_, Result<Vec<crate::store::Event>, ApiError>> {
        Box::pin(async move {
            let events = match run {
                Some(id) => self
                    .store
                    .component_events(&crate::runs::component(&id), after, limit),
                None => self.store.events_since(after, limit),
            };
            Ok(events.unwrap())
        })
    }
}

fn fake() -> (tempfile::TempDir, Arc<Fake>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(Store::default_path(dir.path())).unwrap());
    let bus = EventBus::new(store.clone());
    let fake = Arc::new(Fake {
        store,
        bus,
        plan: Mutex::new(Answer::Ok(json!({ "format_version": "1" }))),
        applied: Mutex::new(Vec::new()),
        pane: Mutex::new(FakePane {
            open: true,
            rows: 24,
            cols: 80,
            typed: Vec::new(),
        }),
        output: tokio::sync::broadcast::channel(FAKE_OUTPUT_QUEUE).0,
        fired: Mutex::new(Vec::new()),
        fleet_runs_asked: Mutex::new(Vec::new()),
    });
    (dir, fake)
}

fn request(method: &str, uri: &str) -> axum::http::request::Builder {
    HttpRequest::builder()
        .method(method)
        .uri(uri)
        .header("host", "127.0.0.1:8766")
}

async fn send(router: &Router, req: HttpRequest<Body>) -> (StatusCode, Value) {
    let response = router.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn get(router: &Router, uri: &str) -> (StatusCode, Value) {
    send(router, request("GET", uri).body(Body::empty()).unwrap()).await
}

#[test]
fn trusted_hosts_are_exactly_the_loopback_names() {
    for ok in [
        "localhost",
        "localhost:8766",
        "LOCALHOST:1",
        "127.0.0.1",
        "127.0.0.1:8766",
        "[::1]",
        "[::1]:8766",
    ] {
        assert!(trusted_host(Some(ok.as_bytes())), "{ok}");
    }
    for bad in [
        "evil.example",
        "localhost.evil.example",
        "127.0.0.1.nip.io:8766",
        "127.0.0.2",
        "localhost:80x",
        "[::1]x",
        "[::2]:8766",
        "",
    ] {
        assert!(!trusted_host(Some(bad.as_bytes())), "{bad}");
    }
    assert!(!trusted_host(None));
    assert!(!trusted_host(Some(b"\xff")));
}

#[tokio::test]
async fn status_answers_the_backend_document() {
    let (_dir, fake) = fake();
    let router = router(fake, ApiAuth::new(Access::Loopback), false);
    let (status, body) = get(&router, "/api/v1/status").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["pid"], 7);
}

#[tokio::test]
async fn an_untrusted_host_is_refused_before_any_handler() {
    let (_dir, fake) = fake();
    let router = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    for host in ["evil.example:8766", "attacker.test"] {
        let req = HttpRequest::builder()
            .method("POST")
            .uri("/api/v1/apply")
            .header("host", host)
            .body(Body::empty())
            .unwrap();
        let (status, body) = send(&router, req).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(body["error"]["code"], "untrusted_host");
    }
    let req = HttpRequest::builder()
        .uri("/api/v1/status")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, req).await.0, StatusCode::FORBIDDEN, "no Host");
    assert!(fake.applied.lock().unwrap().is_empty(), "nothing applied");
}

#[tokio::test]
async fn a_token_is_required_when_configured() {
    let (_dir, fake) = fake();
    let router = router(
        fake,
        ApiAuth::new(Access::Token("s3cret-token".into())),
        false,
    );
    let (status, body) = get(&router, "/api/v1/status").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "unauthorized");
    let wrong = request("GET", "/api/v1/status")
        .header("authorization", "Bearer s3cret-tokeN")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, wrong).await.0, StatusCode::UNAUTHORIZED);
    let right = request("GET", "/api/v1/status")
        .header("authorization", "Bearer s3cret-token")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, right).await.0, StatusCode::OK);
    let response = router
        .clone()
        .oneshot(
            request("GET", "/api/v1/status")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
}

#[tokio::test]
async fn remote_listening_drops_the_host_check_but_never_the_token() {
    let (_dir, fake) = fake();
    let router = router(
        fake,
        ApiAuth::new(Access::Token("s3cret-token".into())),
        true,
    );
    let req = HttpRequest::builder()
        .uri("/api/v1/status")
        .header("host", "npc.internal:8766")
        .header("authorization", "Bearer s3cret-token")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, req).await.0, StatusCode::OK);
    let req = HttpRequest::builder()
        .uri("/api/v1/status")
        .header("host", "npc.internal:8766")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, req).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn plan_and_apply_map_every_answer_to_a_stable_code() {
    let (_dir, fake) = fake();
    let router = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    assert_eq!(get(&router, "/api/v1/plan").await.0, StatusCode::OK);
    let post = |uri: &'static str| request("POST", uri).body(Body::empty()).unwrap();
    for (answer, status, code) in [
        (
            Answer::Invalid(json!({ "report": { "error_count": 1 } })),
            StatusCode::UNPROCESSABLE_ENTITY,
            "manifest_invalid",
        ),
        (
            Answer::Refused(json!({ "reasons": ["x"] })),
            StatusCode::CONFLICT,
            "refused",
        ),
        (
            Answer::Failed("loading the manifest took longer than 10s".into()),
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
        ),
    ] {
        *fake.plan.lock().unwrap() = answer;
        let (got, body) = get(&router, "/api/v1/plan").await;
        assert_eq!((got, body["error"]["code"].as_str()), (status, Some(code)));
        let (got, body) = send(&router, post("/api/v1/apply")).await;
        assert_eq!((got, body["error"]["code"].as_str()), (status, Some(code)));
    }
    assert_eq!(
        send(&router, post("/api/v1/reload")).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        *fake.applied.lock().unwrap(),
        ["api apply", "api apply", "api apply", "api reload"]
    );
    // A GET of apply is not an apply.
    let (status, _) = get(&router, "/api/v1/apply").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(fake.applied.lock().unwrap().len(), 4);
}

async fn publish(fake: &Fake, n: usize) {
    for i in 0..n {
        fake.bus
            .publish(NewEvent::untyped(
                if i % 2 == 0 { "test.even" } else { "test.odd" },
                json!({ "i": i }),
            ))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn events_page_by_id_and_filter_by_kind() {
    let (_dir, fake) = fake();
    publish(&fake, 7).await;
    let router = router(fake, ApiAuth::new(Access::Loopback), false);
    let (status, page) = get(&router, "/api/v1/events?after=2&limit=3").await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<i64> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [3, 4, 5]);
    assert_eq!(page["next_after"], 5);
    let (_, odd) = get(&router, "/api/v1/events?kind=test.odd").await;
    let kinds: Vec<&str> = odd["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["test.odd"; 3]);
    for bad in [
        "/api/v1/events?limit=0",
        "/api/v1/events?limit=1001",
        "/api/v1/events?after=x",
        "/api/v1/events?follow=true",
    ] {
        let (status, body) = get(&router, bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(body["error"]["code"], "bad_request");
    }
}

#[tokio::test]
async fn unknown_endpoints_are_json_404s() {
    let (_dir, fake) = fake();
    let router = router(fake, ApiAuth::new(Access::Loopback), false);
    let (status, body) = get(&router, "/api/v1/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");
}

#[test]
fn the_openapi_document_lists_every_route() {
    let doc = openapi::document();
    for route in ROUTES {
        assert!(
            doc["paths"][route.path][route.method].is_object(),
            "{} {}",
            route.method,
            route.path
        );
    }
    assert_eq!(doc["openapi"], "3.1.0");
}

/// Read SSE events from `body` until `n` have arrived.
async fn sse_ids(body: Body, n: usize) -> Vec<i64> {
    use tokio_stream::StreamExt as _;
    let mut stream = body.into_data_stream();
    let mut text = String::new();
    let mut ids = Vec::new();
    while ids.len() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an event within the deadline")
            .expect("the stream stays open")
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let frame: String = text.drain(..end + 2).collect();
            if let Some(id) = frame.lines().find_map(|l| l.strip_prefix("id: ")) {
                ids.push(id.parse().unwrap());
            }
        }
    }
    ids
}

#[tokio::test]
async fn the_stream_resumes_after_last_event_id_without_gap_or_duplicate() {
    let (_dir, fake) = fake();
    publish(&fake, 5).await;
    let router = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    let req = request("GET", "/api/v1/events/stream")
        .header("last-event-id", "2")
        .body(Body::empty())
        .unwrap();
    let response = router.clone().oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    // Events published while the stream replays and after it.
    let publisher = {
        let fake = fake.clone();
        tokio::spawn(async move { publish(&fake, 20).await })
    };
    let ids = sse_ids(response.into_body(), 23).await;
    publisher.await.unwrap();
    assert_eq!(ids, (3..=25).collect::<Vec<_>>());
    // `?after=` works the same when no header is sent.
    let req = request("GET", "/api/v1/events/stream?after=24")
        .body(Body::empty())
        .unwrap();
    let response = router.clone().oneshot(req).await.unwrap();
    assert_eq!(sse_ids(response.into_body(), 1).await, [25]);
    let req = request("GET", "/api/v1/events/stream")
        .header("last-event-id", "soon")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, req).await.0, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_stream_sees_events_other_processes_write() {
    let (dir, fake) = fake();
    let router = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    let response = router
        .clone()
        .oneshot(
            request("GET", "/api/v1/events/stream")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    // A second writer on the same database, as `npc run` is.
    let other = Store::open(Store::default_path(dir.path())).unwrap();
    let events = vec![crate::store::EncodedEvent::encode(NewEvent::untyped(
        "run.started",
        json!({}),
    ))];
    other.append_events(events).await.unwrap();
    assert_eq!(sse_ids(response.into_body(), 1).await, [1]);
}

#[tokio::test]
async fn the_dashboard_is_served_without_the_token_but_behind_the_host_check() {
    let (_dir, fake) = fake();
    let router = router(
        fake,
        ApiAuth::new(Access::Token("s3cret-token".into())),
        false,
    );
    for (path, content_type, body) in DASHBOARD_ASSETS {
        let response = router
            .clone()
            .oneshot(request("GET", path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(response.headers()["content-type"], content_type);
        assert_eq!(response.headers()["content-security-policy"], DASHBOARD_CSP);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(bytes, body.as_bytes());
    }
    let page = String::from_utf8_lossy(DASHBOARD_ASSETS[0].2.as_bytes()).to_string();
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no CDN"
    );
    let rebound = HttpRequest::builder()
        .uri("/")
        .header("host", "attacker.example")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, rebound).await.0, StatusCode::FORBIDDEN);
    // The data still needs the token.
    assert_eq!(
        get(&router, "/api/v1/status").await.0,
        StatusCode::UNAUTHORIZED
    );
}

fn post_json(uri: &str, body: &str) -> HttpRequest<Body> {
    request("POST", uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn post(uri: &str) -> HttpRequest<Body> {
    request("POST", uri).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn runs_start_list_show_and_cancel_with_stable_errors() {
    let (_dir, fake) = fake();
    let router = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    let (status, started) = send(
        &router,
        post_json("/api/v1/runs", r#"{"profile":"reviewer","prompt":"look"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let id = started["run_id"].as_str().unwrap().to_string();
    let (_, second) = send(
        &router,
        post_json("/api/v1/runs", r#"{"profile":"reviewer"}"#),
    )
    .await;
    let newer = second["run_id"].as_str().unwrap().to_string();

    let (status, page) = get(&router, "/api/v1/runs").await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [newer.as_str(), id.as_str()], "newest first");
    assert_eq!(page["runs"][1]["source"], "manual");
    assert_eq!(page["runs"][1]["profile"], "reviewer");
    assert_eq!(page["runs"][1]["state"], "queued");
    // Started by hand through the API: no trigger, nothing more to say.
    assert_eq!(page["runs"][1]["origin"], "api");
    assert!(page["runs"][1].get("trigger").is_none());
    assert!(page["runs"][1].get("cause").is_none());
    assert!(page["now_ms"].as_i64().is_some_and(|now| now > 0), "{page}");
    let (_, older) = get(&router, &format!("/api/v1/runs?limit=1&before={newer}")).await;
    assert_eq!(older["runs"].as_array().unwrap().len(), 1);
    assert_eq!(older["runs"][0]["id"], id.as_str());

    let (status, one) = get(&router, &format!("/api/v1/runs/{id}")).await;
    assert_eq!((status, &one["id"]), (StatusCode::OK, &json!(id)));
    let (status, events) = get(&router, &format!("/api/v1/runs/{id}/events")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events["events"][0]["kind"], "run.queued");
    let first = events["events"][0]["id"].as_i64().unwrap();
    let (_, later) = get(&router, &format!("/api/v1/runs/{id}/events?since={first}")).await;
    assert_eq!(later["events"], json!([]));

    let (status, cancelled) = send(&router, post(&format!("/api/v1/runs/{id}/cancel"))).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(cancelled, json!({ "run_id": id, "state": "cancelled" }));
    let (status, again) = send(&router, post(&format!("/api/v1/runs/{id}/cancel"))).await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("run.finished"))
    );

    for (status, uri) in [
        (StatusCode::NOT_FOUND, "/api/v1/runs/run-nope"),
        (StatusCode::NOT_FOUND, "/api/v1/runs/run-nope/events"),
    ] {
        let (got, body) = get(&router, uri).await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some("run.not_found")),
            "{uri}"
        );
    }
    let (got, body) = send(&router, post("/api/v1/runs/run-nope/cancel")).await;
    assert_eq!(
        (got, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("run.not_found"))
    );
    for bad in [
        "/api/v1/runs?limit=0",
        "/api/v1/runs?limit=1001",
        "/api/v1/runs?page=2",
        "/api/v1/runs/x/events?since=y",
    ] {
        assert_eq!(get(&router, bad).await.0, StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[tokio::test]
async fn hostile_bodies_get_stable_errors_and_change_nothing() {
    let (_dir, fake) = fake();
    let router = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    let huge = format!(
        r#"{{"profile":"reviewer","prompt":"{}"}}"#,
        "x".repeat(MAX_BODY_BYTES)
    );
    for (body, status, code) in [
        ("{", StatusCode::BAD_REQUEST, "bad_request"),
        ("[1,2]", StatusCode::UNPROCESSABLE_ENTITY, "invalid_body"),
        (
            r#"{"profile":"reviewer","shell":"rm -rf /"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            r#"{"profile":"ghost"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "run.invalid",
        ),
        (
            huge.as_str(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
    ] {
        let (got, answer) = send(&router, post_json("/api/v1/runs", body)).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{}",
            &body[..body.len().min(40)]
        );
    }
    let plain = request("POST", "/api/v1/runs")
        .header("content-type", "text/plain")
        .body(Body::from(r#"{"profile":"reviewer"}"#))
        .unwrap();
    let (got, answer) = send(&router, plain).await;
    assert_eq!(
        (got, answer["error"]["code"].as_str()),
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some("unsupported_media_type")
        )
    );
    assert!(
        fake.store.run_rows(None, 10).unwrap().is_empty(),
        "nothing was queued"
    );
    // Pane input over its own bound, bad sizes, trigger payloads.
    let long = format!(
        r#"{{"data":"{}"}}"#,
        "y".repeat(resources::MAX_PANE_INPUT_BYTES + 1)
    );
    let (got, answer) = send(&router, post_json("/api/v1/panes/shell/input", &long)).await;
    assert_eq!(
        (got, answer["error"]["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("pane.input_too_long"))
    );
    for size in [
        r#"{"cols":0,"rows":24}"#,
        r#"{"cols":80,"rows":1001}"#,
        r#"{"cols":-1,"rows":2}"#,
        r#"{"cols":80}"#,
    ] {
        let (got, _) = send(&router, post_json("/api/v1/panes/shell/resize", size)).await;
        assert_eq!(got, StatusCode::UNPROCESSABLE_ENTITY, "{size}");
    }
    assert!(fake.pane.lock().unwrap().typed.is_empty());
    {
        let pane = fake.pane.lock().unwrap();
        assert_eq!((pane.rows, pane.cols), (24, 80));
    }
    let big = format!(
        r#"{{"payload":"{}"}}"#,
        "z".repeat(crate::triggers::MAX_MANUAL_PAYLOAD_BYTES)
    );
    for (body, status) in [
        (big.as_str(), StatusCode::PAYLOAD_TOO_LARGE),
        ("{nope", StatusCode::BAD_REQUEST),
        (
            r#"{"payload":1,"extra":2}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        assert_eq!(
            send(&router, post_json("/api/v1/triggers/nightly/fire", body))
                .await
                .0,
            status
        );
    }
    assert!(fake.fired.lock().unwrap().is_empty(), "nothing was fired");
}

#[tokio::test]
async fn panes_take_input_resize_close_and_open_through_the_operator_path() {
    let (_dir, fake) = fake();
    let router = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    let (status, list) = get(&router, "/api/v1/panes").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["panes"][0]["name"], "shell");
    assert_eq!(list["panes"][0]["state"], "running");
    let (status, sent) = send(
        &router,
        post_json("/api/v1/panes/shell/input", r#"{"data":"ls\n"}"#),
    )
    .await;
    assert_eq!((status, &sent["sent"]), (StatusCode::ACCEPTED, &json!(3)));
    assert_eq!(fake.pane.lock().unwrap().typed, b"ls\n");
    let (status, _) = send(
        &router,
        post_json("/api/v1/panes/shell/resize", r#"{"cols":120,"rows":40}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        get(&router, "/api/v1/panes").await.1["panes"][0]["cols"],
        120
    );
    assert_eq!(
        send(&router, post("/api/v1/panes/shell/close")).await.0,
        StatusCode::OK
    );
    let (status, closed) = send(
        &router,
        post_json("/api/v1/panes/shell/input", r#"{"data":"x"}"#),
    )
    .await;
    assert_eq!(
        (status, closed["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("pane.not_open"))
    );
    assert_eq!(
        send(&router, post("/api/v1/panes/shell/open")).await.0,
        StatusCode::OK
    );
    let (status, twice) = send(&router, post("/api/v1/panes/shell/open")).await;
    assert_eq!(
        (status, twice["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("pane.already_open"))
    );
    for uri in ["/api/v1/panes/ghost/close", "/api/v1/panes/ghost/open"] {
        let (status, body) = send(&router, post(uri)).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("pane.not_found")),
            "{uri}"
        );
    }
    let (status, _) = send(
        &router,
        post_json("/api/v1/panes/ghost/input", r#"{"data":"x"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn triggers_and_plugins_list_and_a_trigger_fires() {
    let (_dir, fake) = fake();
    let router = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    let (status, list) = get(&router, "/api/v1/triggers").await;
    assert_eq!(
        (status, &list["triggers"][0]["name"]),
        (StatusCode::OK, &json!("nightly"))
    );
    let (status, fired) = send(&router, post("/api/v1/triggers/nightly/fire")).await;
    assert_eq!(
        (status, &fired["run_id"]),
        (StatusCode::ACCEPTED, &json!("run-fired"))
    );
    let (status, _) = send(
        &router,
        post_json(
            "/api/v1/triggers/nightly/fire",
            r#"{"payload":{"ref":"main"}}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(
        *fake.fired.lock().unwrap(),
        [
            ("nightly".to_string(), Value::Null),
            ("nightly".to_string(), json!({ "ref": "main" }))
        ]
    );
    let (status, body) = send(&router, post("/api/v1/triggers/ghost/fire")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("trigger.not_found"))
    );
    let (status, plugins) = get(&router, "/api/v1/plugins").await;
    assert_eq!(
        (status, plugins),
        (StatusCode::OK, json!({ "plugins": [] }))
    );
}

/// `path` with its parameters filled in.
fn concrete(path: &str) -> String {
    path.replace("{id}", "run-x").replace("{name}", "shell")
}

#[tokio::test]
async fn every_route_is_served_and_guarded_by_host_and_token() {
    let (_dir, fake) = fake();
    let open = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    let guarded = router(
        fake.clone(),
        ApiAuth::new(Access::Token("s3cret-token".into())),
        false,
    );
    for route in ROUTES {
        let uri = concrete(route.path);
        let method = route.method.to_uppercase();
        // Served: whatever it answers, it is not the fallback's 404 (the
        // event stream never ends: only its head is read).
        let response = open
            .clone()
            .oneshot(request(&method, &uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        if route.path == SESSION_PATH {
            // Needs no credential; an empty body is no code.
            assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
            continue;
        } else if route.answer.is_some() || route.status == 101 {
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            assert_ne!(
                body["error"]["code"], "not_found",
                "{method} {uri} is routed"
            );
        } else {
            assert_eq!(response.status(), StatusCode::OK, "{method} {uri}");
        }
        let (status, body) = send(
            &guarded,
            request(&method, &uri).body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("unauthorized")),
            "{method} {uri}"
        );
        let rebound = HttpRequest::builder()
            .method(method.as_str())
            .uri(&uri)
            .header("host", "attacker.example")
            .header("authorization", "Bearer s3cret-token")
            .body(Body::empty())
            .unwrap();
        let (status, body) = send(&guarded, rebound).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("untrusted_host")),
            "{method} {uri}"
        );
    }
    assert!(fake.fired.lock().unwrap().is_empty());
    assert!(fake.pane.lock().unwrap().typed.is_empty());
}

/// A terminal upgrade request's headers (no real upgrade under `oneshot`).
fn upgrade(uri: &str, origin: Option<&str>, protocols: &str) -> axum::http::request::Builder {
    let mut req = request("GET", uri)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
    if let Some(origin) = origin {
        req = req.header("origin", origin);
    }
    if !protocols.is_empty() {
        req = req.header("sec-websocket-protocol", protocols);
    }
    req
}

#[tokio::test]
async fn a_terminal_is_refused_to_foreign_origins_bad_subprotocols_and_missing_tokens() {
    let (_dir, fake) = fake();
    let router = router(
        fake.clone(),
        ApiAuth::new(Access::Token("s3cret-token".into())),
        false,
    );
    let uri = "/api/v1/panes/shell/terminal";
    let good = "npc.v1, npc.bearer.s3cret-token";
    let me = Some("http://127.0.0.1:8766");
    for (origin, protocols, status, code) in [
        (me, "npc.v1", StatusCode::UNAUTHORIZED, "unauthorized"),
        (
            me,
            "npc.v1, npc.bearer.wrong",
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        ),
        (
            Some("http://evil.example"),
            good,
            StatusCode::FORBIDDEN,
            "untrusted_origin",
        ),
        (
            Some("http://localhost:8766"),
            good,
            StatusCode::FORBIDDEN,
            "untrusted_origin",
        ),
        (
            Some("null"),
            good,
            StatusCode::FORBIDDEN,
            "untrusted_origin",
        ),
        (None, good, StatusCode::FORBIDDEN, "untrusted_origin"),
        (
            me,
            "npc.bearer.s3cret-token",
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            me,
            "chat, npc.bearer.s3cret-token",
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        // Everything right, but `oneshot` cannot upgrade: past every check.
        (me, good, StatusCode::UPGRADE_REQUIRED, "upgrade_required"),
    ] {
        let (got, body) = send(
            &router,
            upgrade(uri, origin, protocols).body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some(code)),
            "{origin:?} {protocols}"
        );
    }
    // The subprotocol carries the token to terminals only.
    let elsewhere = upgrade("/api/v1/status", me, good)
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, elsewhere).await.0, StatusCode::UNAUTHORIZED);
    // Unknown and closed panes answer before the upgrade.
    let open = super::router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    let (got, body) = send(
        &open,
        upgrade("/api/v1/panes/ghost/terminal", me, "npc.v1")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(
        (got, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("pane.not_found"))
    );
    fake.pane.lock().unwrap().open = false;
    let (got, body) = send(
        &open,
        upgrade(uri, me, "npc.v1").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(
        (got, body["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("pane.not_open"))
    );
}

mod websocket {
    //! The terminal over a real WebSocket on loopback.
    use super::*;
    use futures_util::{SinkExt as _, StreamExt as _};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

    type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

    /// Serve `router` on a free loopback port.
    async fn serve(router: Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        addr
    }

    async fn connect(addr: SocketAddr, protocols: &str) -> (Socket, Option<String>) {
        let mut req = format!("ws://{addr}/api/v1/panes/shell/terminal")
            .into_client_request()
            .unwrap();
        let headers = req.headers_mut();
        headers.insert("origin", format!("http://{addr}").parse().unwrap());
        headers.insert("sec-websocket-protocol", protocols.parse().unwrap());
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (socket, response) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
        let echoed = response
            .headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap().to_string());
        (socket, echoed)
    }

    async fn next(socket: &mut Socket) -> Message {
        tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("a frame within the deadline")
            .expect("the socket stays open")
            .unwrap()
    }

    /// Binary output until it contains `want`.
    async fn output_until(socket: &mut Socket, want: &[u8]) -> Vec<u8> {
        let mut seen = Vec::new();
        while !seen.windows(want.len()).any(|w| w == want) {
            match next(socket).await {
                Message::Binary(b) => seen.extend_from_slice(&b),
                Message::Text(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        seen
    }

    async fn close_code(socket: &mut Socket) -> CloseCode {
        loop {
            match next(socket).await {
                Message::Close(Some(frame)) => return frame.code,
                Message::Close(None) => panic!("a close without a code"),
                _ => {}
            }
        }
    }

    #[tokio::test]
    async fn two_clients_get_scrollback_then_live_output_and_their_input_echoes() {
        let (_dir, fake) = fake();
        let addr = serve(router(
            fake.clone(),
            ApiAuth::new(Access::Token("s3cret-token".into())),
            false,
        ))
        .await;
        let (mut a, echoed) = connect(addr, "npc.v1, npc.bearer.s3cret-token").await;
        assert_eq!(
            echoed.as_deref(),
            Some("npc.v1"),
            "only npc.v1 is echoed, never the token"
        );
        let (mut b, _) = connect(addr, "npc.v1, npc.bearer.s3cret-token").await;
        for socket in [&mut a, &mut b] {
            assert_eq!(next(socket).await, Message::Binary("scrollback$ ".into()));
            let Message::Text(status) = next(socket).await else {
                panic!("a status frame")
            };
            let status: Value = serde_json::from_str(status.as_str()).unwrap();
            assert_eq!(
                (status["type"].as_str(), status["state"].as_str()),
                (Some("status"), Some("working"))
            );
        }
        a.send(Message::Binary("typed by a\n".into()))
            .await
            .unwrap();
        b.send(Message::Text(
            r#"{"type":"input","data":"typed by b\n"}"#.into(),
        ))
        .await
        .unwrap();
        for socket in [&mut a, &mut b] {
            let seen = output_until(socket, b"typed by b\n").await;
            assert!(seen.windows(11).any(|w| w == b"typed by a\n"), "{seen:?}");
        }
        b.send(Message::Text(
            r#"{"type":"resize","cols":132,"rows":43}"#.into(),
        ))
        .await
        .unwrap();
        // The resize is carried out before the next input is.
        b.send(Message::Binary("after\n".into())).await.unwrap();
        output_until(&mut a, b"after\n").await;
        let pane = fake.pane.lock().unwrap();
        assert_eq!((pane.rows, pane.cols), (43, 132));
        assert_eq!(pane.typed, b"typed by a\ntyped by b\nafter\n");
    }

    #[tokio::test]
    async fn anything_but_input_and_resize_closes_with_a_policy_violation() {
        let (_dir, fake) = fake();
        let addr = serve(router(fake.clone(), ApiAuth::new(Access::Loopback), false)).await;
        for (frame, code) in [
            (Message::Text("ls".into()), CloseCode::Policy),
            (
                Message::Text(r#"{"type":"relaunch"}"#.into()),
                CloseCode::Policy,
            ),
            (
                Message::Text(r#"{"type":"resize","cols":0,"rows":1}"#.into()),
                CloseCode::Policy,
            ),
            (
                Message::Text(r#"{"type":"input","data":"x","as":"plugin"}"#.into()),
                CloseCode::Policy,
            ),
            (
                Message::Binary(vec![b'x'; resources::MAX_PANE_INPUT_BYTES + 1].into()),
                CloseCode::Size,
            ),
        ] {
            let (mut socket, _) = connect(addr, "npc.v1").await;
            socket.send(frame).await.unwrap();
            assert_eq!(close_code(&mut socket).await, code);
        }
        assert!(
            fake.pane.lock().unwrap().typed.is_empty(),
            "nothing was typed"
        );
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_is_dropped_and_the_others_go_on() {
        let (_dir, fake) = fake();
        let addr = serve(router(fake.clone(), ApiAuth::new(Access::Loopback), false)).await;
        let (mut slow, _) = connect(addr, "npc.v1").await;
        // Far more output than the socket buffers and the bounded queue hold.
        let chunk: Arc<[u8]> = Arc::from(vec![b'o'; 256 * 1024]);
        for _ in 0..64 {
            let _ = fake.output.send(chunk.clone());
            tokio::task::yield_now().await;
        }
        let _ = fake.output.send(Arc::from(&b"end"[..]));
        assert_eq!(close_code(&mut slow).await, CloseCode::Again);
        // A new client still attaches and is served.
        let (mut fresh, _) = connect(addr, "npc.v1").await;
        fresh.send(Message::Binary("hi\n".into())).await.unwrap();
        output_until(&mut fresh, b"hi\n").await;
    }

    #[tokio::test]
    async fn the_end_of_the_output_is_an_exited_frame() {
        let (_dir, fake) = fake();
        let addr = serve(router(fake.clone(), ApiAuth::new(Access::Loopback), false)).await;
        let (mut socket, _) = connect(addr, "npc.v1").await;
        output_until(&mut socket, b"scrollback$ ").await;
        let _ = fake.output.send(Arc::from(&b""[..]));
        loop {
            if let Message::Text(text) = next(&mut socket).await {
                let frame: Value = serde_json::from_str(text.as_str()).unwrap();
                if frame["type"] == "exited" {
                    assert_eq!(frame["exit"], json!({ "code": 0 }));
                    break;
                }
            }
        }
        assert_eq!(close_code(&mut socket).await, CloseCode::Normal);
    }
}

#[tokio::test]
async fn a_page_on_another_origin_changes_nothing_even_without_a_body() {
    let (_dir, fake) = fake();
    // `auth = "none"`: only the origin rule stands between a page and the API.
    let router = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    let evil = |method: &str, uri: &str, content_type: Option<&str>, body: &'static str| {
        let mut req = request(method, uri).header("origin", "http://evil.example");
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        req.body(Body::from(body)).unwrap()
    };
    for req in [
        evil(
            "POST",
            "/api/v1/triggers/nightly/fire",
            Some("text/plain"),
            "{}",
        ),
        evil("POST", "/api/v1/apply", None, ""),
        evil("POST", "/api/v1/reload", None, ""),
        evil("POST", "/api/v1/panes/shell/close", None, ""),
        evil("POST", "/api/v1/runs/run-x/cancel", None, ""),
        evil(
            "POST",
            "/api/v1/session",
            Some("application/json"),
            r#"{"code":"x"}"#,
        ),
    ] {
        let uri = req.uri().to_string();
        let (status, body) = send(&router, req).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("untrusted_origin")),
            "{uri}"
        );
    }
    // Without an Origin, a browser's cross-site fetch still says so.
    let cross = request("POST", "/api/v1/apply")
        .header("sec-fetch-site", "cross-site")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, cross).await.0, StatusCode::FORBIDDEN);
    // A body that is not JSON is refused before any handler.
    let plain = request("POST", "/api/v1/triggers/nightly/fire")
        .header("content-type", "text/plain")
        .body(Body::from("{}"))
        .unwrap();
    let (status, body) = send(&router, plain).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
    assert!(fake.fired.lock().unwrap().is_empty());
    assert!(fake.applied.lock().unwrap().is_empty());
    // Reading is allowed from anywhere the host check lets through.
    let read = request("GET", "/api/v1/status")
        .header("origin", "http://evil.example")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, read).await.0, StatusCode::OK);
}

#[tokio::test]
async fn the_dashboard_redeems_a_one_time_code_for_a_session_cookie() {
    let (_dir, fake) = fake();
    let auth = ApiAuth::new(Access::Token("s3cret-token".into()));
    let code = auth.dashboard.issue_code().unwrap();
    let router = router(fake.clone(), auth, false);
    let redeem = |code: &str| {
        request("POST", "/api/v1/session")
            .header("origin", "http://127.0.0.1:8766")
            .header("content-type", "application/json")
            .body(Body::from(format!("{{\"code\":\"{code}\"}}")))
            .unwrap()
    };
    let response = router.clone().oneshot(redeem(&code)).await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let cookie = response.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    // The code served once.
    let (status, body) = send(&router, redeem(&code)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("bad_code"))
    );
    // The cookie is a credential; a forged one is not.
    let with = |cookie: &str| {
        request("GET", "/api/v1/status")
            .header("cookie", cookie)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&router, with(&session)).await.0, StatusCode::OK);
    assert_eq!(
        send(&router, with("npc_session=0000")).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn the_fleet_endpoints_answer_through_the_backend_within_bounds() {
    let (_dir, fake) = fake();
    let router = router(fake.clone(), ApiAuth::new(Access::Loopback), false);
    let (status, body) = get(&router, "/api/v1/fleet/workers").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "fleet.none");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("[store] url")
    );
    for bad in ["limit=0", "limit=1001", "limit=x", "other=1"] {
        let (status, body) = get(&router, &format!("/api/v1/fleet/runs?{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    assert!(fake.fleet_runs_asked.lock().unwrap().is_empty());
    let (status, body) = get(&router, "/api/v1/fleet/runs").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({ "fleet": "fleet", "now_ms": 1, "runs": [] }));
    get(&router, "/api/v1/fleet/runs?limit=5&before=run-x").await;
    assert_eq!(
        *fake.fleet_runs_asked.lock().unwrap(),
        vec![
            (fleet::DEFAULT_FLEET_RUNS_LIMIT, None),
            (5, Some("run-x".to_string()))
        ]
    );

    for kind in ["one", "two", "three"] {
        let event =
            NewEvent::untyped(kind, json!({})).for_component(crate::runs::component("run-a"));
        fake.bus.publish(event).await.unwrap();
    }
    let (status, first) = get(&router, "/api/v1/fleet/events?run=run-a&limit=2").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let kinds = |page: &Value| -> Vec<String> {
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["kind"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(kinds(&first), ["one", "two"]);
    let next = first["next_after"].as_i64().unwrap();
    let (_, rest) = get(
        &router,
        &format!("/api/v1/fleet/events?run=run-a&after={next}"),
    )
    .await;
    assert_eq!(kinds(&rest), ["three"]);
    assert_eq!(
        get(&router, "/api/v1/fleet/events?limit=0").await.0,
        StatusCode::BAD_REQUEST
    );
}
