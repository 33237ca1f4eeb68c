//! A daemon in front of a fleet (`[store] url`): it connects to the fleet's
//! shared PostgreSQL store and, once connected, hands the fleet's runs
//! (triggers' firings, runs started through the API) to it instead of its
//! own queue; `npc worker`s carry them out. Until the store answers those
//! runs are refused (a webhook answers 503), never run here, and the
//! connection is retried with backoff while the daemon serves everything
//! else. The URL holds a password: nothing here prints it.
//!
//! Once joined, the daemon stands for the fleet's scheduling: every
//! daemon of the fleet asks for the lead (`store::pg::Leadership`) every
//! third of `[store] lease_timeout`, the one that holds it fires cron from
//! the fleet's stored state, and one that loses it stops firing at once.
//! The leader also prunes the fleet's old runs (every
//! `runs::executor::PRUNE_EVERY`, as a daemon prunes its own), keeping
//! their live webhook replay keys.
//!
//! Architecture invariant: this module never claims or carries out a run;
//! the daemon only enqueues into the shared store.

use std::sync::Arc;
use std::time::Duration;

use super::triggers::TriggerDriver;
use crate::bus::EventBus;
use crate::event::{self as ev, Event};
use crate::runs::Runs;
use crate::runs::executor::PRUNE_EVERY;
use crate::runs::fleet::{RETRY_INITIAL, RETRY_MAX};
use crate::store::NewEvent;
use crate::store::pg::PgStore;
use crate::store::queue::RUN_HISTORY_LIMIT;

/// Connect to the shared store of `fleet` at `url` until it answers, then
/// hand `runs` to it (each recording `remote`, the repository's `origin`
/// without credentials); returns the store.
pub(super) async fn join(
    runs: &Arc<Runs>,
    bus: &EventBus,
    url: &str,
    fleet: &str,
    remote: Option<String>,
) -> Arc<PgStore> {
    let mut backoff = RETRY_INITIAL;
    let mut said = false;
    loop {
        match PgStore::connect(url, fleet).await {
            Ok(store) => {
                let store = Arc::new(store);
                runs.queue().joined(fleet, store.clone(), remote);
                tracing::info!("joined fleet `{}`", crate::stdx::term::printable(fleet));
                publish(
                    bus,
                    Event::StoreConnected(ev::Fleet {
                        fleet: fleet.to_string(),
                    }),
                )
                .await;
                return store;
            }
            Err(e) => {
                let error = e.to_string();
                tracing::warn!("cannot reach the shared store: {error}; retrying in {backoff:?}");
                if !said {
                    said = true;
                    let payload = ev::FleetError {
                        fleet: fleet.to_string(),
                        error: error.clone(),
                    };
                    publish(bus, Event::StoreUnreachable(payload)).await;
                }
                runs.queue().not_joined(fleet, error);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// How often a daemon that joined its fleet asks whether the store still
/// answers (and at the schema it reads).
pub const HEALTH_EVERY: Duration = Duration::from_secs(5);

/// For as long as the daemon runs, after [`join`]: ask the store every
/// [`HEALTH_EVERY`] whether it answers at this build's schema. On the first
/// failure the fleet's runs are refused again (a webhook answers 503
/// `webhook.store_unreachable`; `npc status` says `unreachable` with the
/// reason) and `store.unreachable` is recorded; on the first answer after
/// it, with the schema checked again, they go to the store again and
/// `store.connected` is recorded. One event per change, never per try.
pub(super) async fn watch_health(
    store: Arc<PgStore>,
    runs: Arc<Runs>,
    bus: EventBus,
    remote: Option<String>,
) {
    let fleet = store.fleet().to_string();
    let mut healthy = true;
    loop {
        tokio::time::sleep(HEALTH_EVERY).await;
        match store.check().await {
            Ok(()) if !healthy => {
                healthy = true;
                runs.queue().joined(&fleet, store.clone(), remote.clone());
                tracing::info!("the shared store answers again");
                publish(
                    &bus,
                    Event::StoreConnected(ev::Fleet {
                        fleet: fleet.to_string(),
                    }),
                )
                .await;
            }
            Ok(()) => {}
            Err(e) => {
                let error = e.to_string();
                runs.queue().not_joined(&fleet, error.clone());
                if healthy {
                    healthy = false;
                    tracing::warn!("the shared store stopped answering: {error}");
                    let payload = ev::FleetError {
                        fleet: fleet.to_string(),
                        error: error.clone(),
                    };
                    publish(&bus, Event::StoreUnreachable(payload)).await;
                }
            }
        }
    }
}

/// Stand for the fleet's scheduling for as long as the daemon runs: ask
/// for the lead every third of `lease`; while leading, fire cron from the
/// fleet's state and renew; on any failure to renew, stop firing first.
pub(super) async fn schedule(
    store: &Arc<PgStore>,
    triggers: &Arc<TriggerDriver>,
    bus: &EventBus,
    lease: Duration,
) {
    let fleet = store.fleet().to_string();
    loop {
        match store.try_lead(lease).await {
            Ok(Some(leadership)) => {
                lead(store, triggers, &fleet).await;
                publish(
                    bus,
                    Event::SchedulerLeading(ev::Fleet {
                        fleet: fleet.to_string(),
                    }),
                )
                .await;
                let mut pruned: Option<tokio::time::Instant> = None;
                let error = loop {
                    if pruned.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                        pruned = Some(tokio::time::Instant::now());
                        // Apart, so a long prune never delays a renewal.
                        let store = store.clone();
                        tokio::spawn(async move {
                            if let Err(e) = store.prune(RUN_HISTORY_LIMIT).await {
                                tracing::warn!("cannot prune the fleet's old runs: {e}");
                            }
                        });
                    }
                    tokio::time::sleep(lease / 3).await;
                    if let Err(e) = leadership.renew().await {
                        break e.to_string();
                    }
                };
                // Firing stops before the lock can be anyone else's.
                triggers.stand_by();
                drop(leadership);
                tracing::warn!("lost the lead of the fleet's scheduling: {error}");
                let payload = ev::FleetError {
                    fleet: fleet.to_string(),
                    error: error.to_string(),
                };
                publish(bus, Event::SchedulerStandby(payload)).await;
            }
            Ok(None) => {}
            Err(e) => tracing::debug!("cannot ask for the fleet's scheduling: {e}"),
        }
        tokio::time::sleep(lease / 3).await;
    }
}

/// Start the cron triggers from the fleet's state and tell the fleet
/// where each starts.
async fn lead(store: &PgStore, triggers: &TriggerDriver, fleet: &str) {
    let key = crate::triggers::cron::STATE_KEY;
    let shared = match store.trigger_values(key).await {
        Ok(shared) => shared,
        Err(e) => {
            tracing::warn!("cannot read the fleet's trigger state: {e}");
            Default::default()
        }
    };
    tracing::info!(
        "leading the scheduling of fleet `{}`",
        crate::stdx::term::printable(fleet)
    );
    for (name, value) in triggers.lead(&shared).await {
        if let Err(e) = store.set_trigger_value(&name, key, &value).await {
            tracing::warn!("trigger `{name}`: cannot share its state: {e}");
        }
    }
}

async fn publish(bus: &EventBus, event: Event) {
    let kind = event.kind();
    if let Err(e) = bus.publish(NewEvent::from(event)).await {
        tracing::warn!("cannot record `{kind}`: {e}");
    }
}
