//! The daemon's notice relay: the pane host's notices (a pane entering
//! `needs_attention`, a plugin's `attention`; each also a `pane.notice`
//! event) are posted to a notice board (`crate::store::notices::Notices`),
//! and the notices others post there come back as [`NOTICE_EVENT`] events
//! on this daemon's bus, so `npc events --follow`, the REST API's stream
//! and the dashboard hear them. Two boards: the user-level one every
//! daemon of the user on this machine shares ([`start`]: other
//! repositories' notices), and, with `[store] url`, the fleet's in
//! PostgreSQL that every daemon of the fleet shares whatever machine it
//! runs on ([`start_fleet`]: its notices name their `host` and `fleet`).
//! Notices posted before the relay started are not replayed; a daemon's
//! own notices are not echoed back to it.
//!
//! Architecture invariant: the relay carries names and the fixed reason
//! label only, never pane output or plugin text, and it never acts on a
//! notice (no pane, plugin or run is touched from here).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::Runtime;
use crate::bus::EventBus;
use crate::panes::Notice as PaneNotice;
use crate::store::NewEvent;
use crate::store::notices::{NewNotice, Notice, NoticeBoard, Notices};

/// Event: another daemon's notice, relayed from a board.
pub const NOTICE_EVENT: &str = "notice";
/// How often a board is read for other daemons' notices.
pub const NOTICE_POLL: Duration = Duration::from_millis(500);

/// Which board a relay serves, and so which notices are this daemon's own.
#[derive(Debug, Clone)]
enum Scope {
    /// The user-level board of this machine: own notices are this
    /// repository's.
    User,
    /// The fleet's board: own notices are this repository's on this host.
    Fleet { fleet: String },
}

/// This daemon, as its notices name it.
#[derive(Debug, Clone)]
struct Own {
    host: String,
    repository: String,
}

/// Start the relay for `runtime` on the user-level board in `dir` until
/// `stop`. A board that cannot be opened is a warning: notices then stay
/// local.
pub async fn start(runtime: &Arc<Runtime>, dir: std::path::PathBuf, stop: CancellationToken) {
    let opened = tokio::task::spawn_blocking(move || NoticeBoard::open(&dir)).await;
    let board = match opened {
        Ok(Ok(board)) => board,
        Ok(Err(e)) => {
            tracing::warn!("notices of other repositories are off: {e}");
            return;
        }
        Err(join) => {
            tracing::warn!("notices of other repositories are off: {join}");
            return;
        }
    };
    let local = runtime.panes().notices();
    relay(
        Arc::new(board),
        Scope::User,
        local,
        runtime.bus().clone(),
        Own {
            host: crate::runs::fleet::host_name(),
            repository: runtime.paths().root.display().to_string(),
        },
        stop,
    )
    .await;
}

/// A daemon of fleet `fleet` on the repository at `repository`, whose
/// relay on the fleet's board records on `bus`.
pub(super) struct FleetRelay<'a> {
    pub fleet: &'a str,
    pub repository: String,
    pub bus: EventBus,
}

impl FleetRelay<'_> {
    /// Start the relay on the fleet's `board` until `stop`, posting the
    /// pane host's notices from `local` on.
    pub async fn start(
        self,
        board: Arc<dyn Notices>,
        local: broadcast::Receiver<PaneNotice>,
        stop: CancellationToken,
    ) {
        let scope = Scope::Fleet {
            fleet: self.fleet.to_string(),
        };
        let own = Own {
            host: crate::runs::fleet::host_name(),
            repository: self.repository,
        };
        relay(board, scope, local, self.bus, own, stop).await;
    }
}

/// Post `local`'s notices to `board` and relay the others' from it.
async fn relay(
    board: Arc<dyn Notices>,
    scope: Scope,
    mut local: broadcast::Receiver<PaneNotice>,
    bus: EventBus,
    own: Own,
    stop: CancellationToken,
) {
    let mut last = match board.last_id().await {
        Ok(last) => last,
        Err(e) => {
            tracing::warn!("notices of other daemons are off: {e}");
            return;
        }
    };
    if let Scope::Fleet { fleet } = &scope {
        tracing::info!(
            "relaying the notices of fleet `{}`",
            crate::stdx::term::printable(fleet)
        );
    }
    // Posting: the pane host's notices, handed over directly (not a bus
    // subscription, which would wake this task for every event).
    let (poster, from, posting_stop) = (board.clone(), own.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            let notice = tokio::select! {
                () = posting_stop.cancelled() => return,
                notice = local.recv() => notice,
            };
            let notice = match notice {
                Ok(notice) => notice,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!("{n} notices were not posted to other daemons");
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let posted = NewNotice {
                host: from.host.clone(),
                repository: from.repository.clone(),
                pane: notice.pane,
                plugin: notice.plugin,
                reason: notice.reason.to_string(),
            };
            if let Err(e) = poster.post(&posted).await {
                tracing::warn!("cannot post a notice for other daemons: {e}");
            }
        }
    });
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(NOTICE_POLL) => {}
            }
            let notices = match board.since(last).await {
                Ok(notices) => notices,
                Err(e) => {
                    tracing::warn!("cannot read the notice board: {e}");
                    continue;
                }
            };
            for notice in notices {
                last = notice.id;
                if let Some(event) = relayed(&notice, &scope, &own)
                    && let Err(e) = bus.publish(event).await
                {
                    tracing::warn!("cannot record a notice: {e}");
                }
            }
        }
    });
}

/// The event `notice` becomes on this daemon's bus; `None` for its own.
fn relayed(notice: &Notice, scope: &Scope, own: &Own) -> Option<NewEvent> {
    let mut payload = crate::event::Notice {
        repository: notice.repository.clone(),
        pane: notice.pane.clone(),
        plugin: notice.plugin.clone(),
        reason: notice.reason.clone(),
        at_ms: notice.at_ms,
        host: None,
        fleet: None,
    };
    match scope {
        Scope::User if notice.repository == own.repository => return None,
        Scope::User => {}
        Scope::Fleet { .. } if notice.repository == own.repository && notice.host == own.host => {
            return None;
        }
        Scope::Fleet { fleet } => {
            payload.host = Some(notice.host.clone());
            payload.fleet = Some(fleet.clone());
        }
    }
    Some(NewEvent::from(crate::event::Event::Notice(payload)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(host: &str, repository: &str) -> Notice {
        Notice {
            id: 1,
            at_ms: 2,
            repository: repository.into(),
            pane: "one".into(),
            plugin: "rec".into(),
            reason: "attention".into(),
            host: host.into(),
        }
    }

    #[test]
    fn a_daemon_hears_every_notice_but_its_own_and_a_fleets_name_their_host() {
        let own = Own {
            host: "a".into(),
            repository: "/r".into(),
        };
        let fleet = Scope::Fleet {
            fleet: "f@remote".into(),
        };
        assert!(relayed(&notice("", "/r"), &Scope::User, &own).is_none());
        let other = relayed(&notice("", "/other"), &Scope::User, &own).unwrap();
        assert!(other.payload().get("host").is_none());
        assert!(relayed(&notice("a", "/r"), &fleet, &own).is_none());
        // The same checkout path on another machine is another daemon.
        let elsewhere = relayed(&notice("b", "/r"), &fleet, &own).unwrap();
        assert_eq!(elsewhere.kind(), NOTICE_EVENT);
        assert_eq!(elsewhere.payload()["host"], "b");
        assert_eq!(elsewhere.payload()["fleet"], "f@remote");
        assert_eq!(elsewhere.payload()["repository"], "/r");
    }
}
