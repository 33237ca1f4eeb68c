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
                .enqueue_run(crate::store::queue::NewRun {
                    id: id.clone(),
                    trigger: crate::triggers::MANUAL_QUEUE.to_string(),
                    origin: "api".to_string(),
                    dedupe_key: None,
                    payload: serde_json::to_string(&run).unwrap(),
                    skip_if_active: false,
                    max_queued: 10,
                    state: None,
                })
                .await
                .unwrap();
            self.bus
                .publish(
                    NewEvent::new("run.queued", json!({ "run_id": id }))
                        .for_component(crate::runs::component(&id)),
                )
                .await
                .unwrap();
            Ok(id)
        })
    }
    fn cancel_run(&self, id: String) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async move {
            let state = crate::store::queue::state::CANCELLED;
            match self.store.trigger_run(&id).unwrap() {
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
            use crate::runtime::api::pane_error;
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
        use crate::runtime::api::pane_error;
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
    let router = router(fake, Access::Loopback, false);
    let (status, body) = get(&router, "/api/v1/status").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["pid"], 7);
}

#[tokio::test]
async fn an_untrusted_host_is_refused_before_any_handler() {
    let (_dir, fake) = fake();
    let router = router(fake.clone(), Access::Loopback, false);
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
    let router = router(fake, Access::Token("s3cret-token".into()), false);
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
    let router = router(fake, Access::Token("s3cret-token".into()), true);
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
    let router = router(fake.clone(), Access::Loopback, false);
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
            .publish(NewEvent::new(
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
    let router = router(fake, Access::Loopback, false);
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
    let router = router(fake, Access::Loopback, false);
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
    let router = router(fake.clone(), Access::Loopback, false);
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
    let router = router(fake.clone(), Access::Loopback, false);
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
    let events = vec![crate::store::EncodedEvent::encode(NewEvent::new(
        "run.started",
        json!({}),
    ))];
    other.append_events(events).await.unwrap();
    assert_eq!(sse_ids(response.into_body(), 1).await, [1]);
}

#[tokio::test]
async fn the_dashboard_is_served_without_the_token_but_behind_the_host_check() {
    let (_dir, fake) = fake();
    let router = router(fake, Access::Token("s3cret-token".into()), false);
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
