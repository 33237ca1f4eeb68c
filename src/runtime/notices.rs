//! The daemon's notice relay: the pane host's notices (a pane entering
//! `needs_attention`, a plugin's `attention`; each also a `pane.notice`
//! event) are posted to the user-level notice board
//! (`crate::store::notices`), and the notices other
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
use crate::store::NewEvent;
use crate::store::notices::{NoticeBoard, NoticeError};

/// Event: another repository's notice, relayed from the board.
pub const NOTICE_EVENT: &str = "notice";
/// How often the board is read for other repositories' notices.
pub const NOTICE_POLL: Duration = Duration::from_millis(500);

/// Start the relay for `runtime` on the board in `dir` until `stop`. A
/// board that cannot be opened is a warning: notices then stay local.
pub async fn start(runtime: &Arc<Runtime>, dir: std::path::PathBuf, stop: CancellationToken) {
    let opened = tokio::task::spawn_blocking(move || {
        let board = NoticeBoard::open(&dir)?;
        let last = board.last_id()?;
        Ok::<_, NoticeError>((Arc::new(board), last))
    })
    .await;
    let opened = match opened {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(join) => Err(join.to_string()),
    };
    let (board, mut last) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            tracing::warn!("notices of other repositories are off: {e}");
            return;
        }
    };
    let repository = runtime.paths().root.display().to_string();
    // Posting: the pane host's notices, handed over directly (not a bus
    // subscription, which would wake this task for every event).
    let mut local = runtime.panes().notices();
    let (poster, own, posting_stop) = (board.clone(), repository.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            let notice = tokio::select! {
                () = posting_stop.cancelled() => return,
                notice = local.recv() => notice,
            };
            let notice = match notice {
                Ok(notice) => notice,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!("{n} notices were not posted to other repositories");
                    continue;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            let (board, repository) = (poster.clone(), own.clone());
            let posted = tokio::task::spawn_blocking(move || {
                board.post(&repository, &notice.pane, &notice.plugin, notice.reason)
            })
            .await;
            if let Ok(Err(e)) = posted {
                tracing::warn!("cannot post a notice for other repositories: {e}");
            }
        }
    });
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
