//! Live events over Server-Sent Events, resumable without a gap.
//!
//! The store is the one stream of a repository (the daemon's events and
//! those `npc run` writes from its own process), and an event is in the
//! store before anyone hears of it. One tailer per API ([`Live`]) reads the
//! store after the last id it saw, woken by the daemon's bus (and polled
//! for other writers), and broadcasts each event once to every stream. A
//! stream first replays the log after the client's `Last-Event-ID` (or
//! `?after=`) from the store, then takes live events, skipping ids it has
//! sent; if it falls behind the broadcast it reads the missed range back
//! from the store. So a client that reconnects with the last id it saw
//! gets every later event exactly once.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::{Semaphore, broadcast, mpsc};

use super::{ApiError, ApiState};
use crate::bus::EventBus;
use crate::store::{Event, Store};

/// Events the tailer holds for slow streams before they lag (a lagging
/// stream reads the gap back from the store).
pub const LIVE_CAPACITY: usize = 4096;
/// Events read from the store per page (replay and tailing).
pub const PAGE: usize = 500;
/// How often the tailer looks for events other processes wrote.
pub const FOREIGN_POLL: Duration = Duration::from_millis(200);
/// Streams served at once; more get `503 too_many_streams`.
pub const MAX_STREAMS: usize = 256;
/// Events buffered per stream between the store/broadcast and the socket.
pub const STREAM_BUFFER: usize = 256;
/// Keep-alive comment interval on an idle stream.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The API's shared tailer: every event, once, in id order.
#[derive(Clone, Debug)]
pub struct Live {
    tx: broadcast::Sender<Arc<Event>>,
    store: Arc<Store>,
    streams: Arc<Semaphore>,
}

impl Live {
    /// Start tailing `store` from its current end, woken by `bus`.
    pub fn start(store: Arc<Store>, bus: EventBus) -> Self {
        let (tx, _) = broadcast::channel(LIVE_CAPACITY);
        let live = Self {
            tx: tx.clone(),
            store: store.clone(),
            streams: Arc::new(Semaphore::new(MAX_STREAMS)),
        };
        // The tailer starts from the log's end as it is now, read before
        // this returns: an event committed later, by any process, is
        // broadcast, and one committed earlier is in every stream's replay.
        match store.last_event_id() {
            Ok(last) => {
                tokio::spawn(tail(store, bus, tx, last));
            }
            Err(e) => tracing::error!("the event stream cannot follow the log: {e}"),
        }
        live
    }
}

async fn page_after(store: &Arc<Store>, after: i64) -> Option<Vec<Event>> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || store.events_since(after, PAGE))
        .await
        .ok()?
        .ok()
}

/// Read the store after the last id seen whenever the bus publishes (or
/// every [`FOREIGN_POLL`]), and broadcast what is new. Ends when every
/// receiver and the bus are gone.
async fn tail(store: Arc<Store>, bus: EventBus, tx: broadcast::Sender<Arc<Event>>, mut last: i64) {
    let mut wake = bus.follow(last).ok();
    loop {
        let Some(page) = page_after(&store, last).await else {
            return;
        };
        let full = page.len() == PAGE;
        for event in page {
            last = event.id;
            // No receiver right now is fine: streams replay from the store.
            let _ = tx.send(Arc::new(event));
        }
        if full {
            continue;
        }
        match &mut wake {
            Some(w) => {
                tokio::select! {
                    woke = w.recv() => if woke.is_none() { wake = None },
                    () = tokio::time::sleep(FOREIGN_POLL) => {}
                }
            }
            None => tokio::time::sleep(FOREIGN_POLL).await,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StreamQuery {
    after: Option<i64>,
}

/// `GET /api/v1/events/stream`.
pub(super) async fn stream(
    State(state): State<ApiState>,
    headers: HeaderMap,
    query: Result<Query<StreamQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return ApiError::bad_request("bad query: the only parameter is `after` (an event id)")
            .into_response();
    };
    let resume = match headers.get("last-event-id") {
        Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<i64>().ok()) {
            Some(id) => id,
            None => {
                return ApiError::bad_request("`Last-Event-ID` must be an event id (an integer)")
                    .into_response();
            }
        },
        None => query.after.unwrap_or(0),
    }
    .max(0);
    let Ok(permit) = state.live.streams.clone().try_acquire_owned() else {
        return ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "too_many_streams",
            format!("{MAX_STREAMS} event streams are open already; close one and retry"),
        )
        .into_response();
    };
    // Subscribe before replaying: nothing between the two is missed.
    let live = state.live.tx.subscribe();
    let (out, rx) = mpsc::channel::<Result<SseEvent, Infallible>>(STREAM_BUFFER);
    let store = state.live.store.clone();
    tokio::spawn(async move {
        let _permit = permit;
        feed(store, live, resume, out).await;
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

fn sse_event(event: &Event) -> SseEvent {
    SseEvent::default()
        .id(event.id.to_string())
        .event(&event.kind)
        .data(serde_json::to_string(event).unwrap_or_default())
}

/// Replay after `after` from the store, then forward live events; each id
/// is sent once, in order. Ends when the client goes.
async fn feed(
    store: Arc<Store>,
    mut live: broadcast::Receiver<Arc<Event>>,
    mut after: i64,
    out: mpsc::Sender<Result<SseEvent, Infallible>>,
) {
    // Replay (also after a lag): read the store until it has nothing newer.
    let catch_up = |after: i64| {
        let store = store.clone();
        let out = out.clone();
        async move {
            let mut after = after;
            loop {
                let page = page_after(&store, after).await?;
                if page.is_empty() {
                    return Some(after);
                }
                for event in &page {
                    out.send(Ok(sse_event(event))).await.ok()?;
                    after = event.id;
                }
            }
        }
    };
    let Some(caught) = catch_up(after).await else {
        return;
    };
    after = caught;
    loop {
        match live.recv().await {
            Ok(event) if event.id <= after => {}
            Ok(event) => {
                if event.id > after + 1 {
                    // Written by another process between our reads: the
                    // store has the ones in between.
                    match catch_up(after).await {
                        Some(caught) => after = caught,
                        None => return,
                    }
                    if event.id <= after {
                        continue;
                    }
                }
                if out.send(Ok(sse_event(&event))).await.is_err() {
                    return;
                }
                after = event.id;
            }
            Err(broadcast::error::RecvError::Lagged(_)) => match catch_up(after).await {
                Some(caught) => after = caught,
                None => return,
            },
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
