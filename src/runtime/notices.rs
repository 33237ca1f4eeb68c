//! The daemon's notice relay: the repository's `pane.notice` events (a pane
//! entering `needs_attention`, a plugin's `attention`) are posted to the
//! user-level notice board (`crate::store::notices`), and the notices other
//! repositories' daemons post there come back as [`NOTICE_EVENT`] events on
//! this daemon's bus, so `npc events --follow`, the REST API's stream and
//! the dashboard of every repository hear them. Notices posted before the
//! daemon started are not replayed; a repository's own notices are not
//! echoed back to it.
//!
//! Architecture invariant: the relay carries names and the fixed reason
//! label only, never pane output or plugin text, and it never acts on a
//! notice (no pane, plugin or run is touched from here).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Runtime;
use crate::plan::ComponentId;
use crate::store::NewEvent;
use crate::store::notices::{NoticeBoard, NoticeError};

/// The local event a notice is posted from.
pub const LOCAL_NOTICE_EVENT: &str = "pane.notice";
/// Event: another repository's notice, relayed from the board.
pub const NOTICE_EVENT: &str = "notice";
/// How often the board is read for other repositories' notices.
pub const NOTICE_POLL: Duration = Duration::from_millis(500);
/// The relay's bus subscriber.
const SUBSCRIBER: &str = "npcagent.notices";

/// Start the relay for `runtime` on the board in `dir` until `stop`. A
/// board that cannot be opened is a warning: notices then stay local.
pub async fn start(runtime: &Arc<Runtime>, dir: std::path::PathBuf, stop: CancellationToken) {
    let opened = tokio::task::spawn_blocking(move || {
        let board = NoticeBoard::open(&dir)?;
        let last = board.last_id()?;
        Ok::<_, NoticeError>((Arc::new(board), last))
    })
    .await;
    let (board, mut last) = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(e)) => {
            tracing::warn!("notices of other repositories are off: {e}");
            return;
        }
        Err(e) => {
            tracing::warn!("notices of other repositories are off: {e}");
            return;
        }
    };
    let repository = runtime.paths().root.display().to_string();
    let poster = board.clone();
    let own = repository.clone();
    let subscribed = runtime.bus().subscribe(
        SUBSCRIBER,
        |e| e.kind == LOCAL_NOTICE_EVENT,
        move |event| {
            let (board, repository) = (poster.clone(), own.clone());
            async move {
                let pane = event
                    .component
                    .as_deref()
                    .and_then(ComponentId::parse)
                    .map(|id| id.name)
                    .unwrap_or_default();
                let plugin = event.payload["plugin"].as_str().unwrap_or("").to_string();
                let reason = event.payload["reason"].as_str().unwrap_or("").to_string();
                tokio::task::spawn_blocking(move || {
                    board.post(&repository, &pane, &plugin, &reason)
                })
                .await
                .map_err(|e| e.to_string())?
                .map(drop)
                .map_err(|e| e.to_string())
            }
        },
    );
    if let Err(e) = subscribed {
        tracing::warn!("notices are not posted to other repositories: {e}");
    }
    let bus = runtime.bus().clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(NOTICE_POLL) => {}
            }
            let reader = board.clone();
            let read = tokio::task::spawn_blocking(move || reader.since(last)).await;
            let notices = match read {
                Ok(Ok(notices)) => notices,
                Ok(Err(e)) => {
                    tracing::warn!("cannot read the notice board: {e}");
                    continue;
                }
                Err(_) => continue,
            };
            for notice in notices {
                last = notice.id;
                if notice.repository == repository {
                    continue;
                }
                let event = NewEvent::new(
                    NOTICE_EVENT,
                    json!({
                        "repository": notice.repository,
                        "pane": notice.pane,
                        "plugin": notice.plugin,
                        "reason": notice.reason,
                        "at_ms": notice.at_ms,
                    }),
                );
                if let Err(e) = bus.publish(event).await {
                    tracing::warn!("cannot record a notice: {e}");
                }
            }
        }
    });
}
