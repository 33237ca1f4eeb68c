//! One scheduler per fleet: the leader holds a PostgreSQL advisory lock
//! keyed by the fleet, taken inside a transaction on a connection of its
//! own that runs with `idle_in_transaction_session_timeout` set to the
//! lease. The leader renews by running a statement in that transaction
//! every third of the lease; a leader that stops (killed, paused, cut off)
//! has its session ended by the server once the lease passes with no
//! statement, which releases the lock, and the next scheduler that asks
//! takes it. A leader whose renewal fails or does not answer within a
//! third of the lease steps down before the server could hand the lock on,
//! so two live leaders never overlap; one that wakes up late may fire once
//! more, and the unique `(trigger, fire time)` key keeps that at most once.
//! Trigger state (a cron trigger's next fire time) is read and written
//! here so a new leader goes on where the last one stopped.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{PgStore, pg_error};
use crate::store::StoreError;
use crate::store::fleet::lease_ms;

/// The advisory lock class of a fleet's scheduler.
const LEADER_LOCK_CLASS: i32 = 0x6e70_6c64;

/// The fleet's scheduling, held while this value lives (dropping it closes
/// its connection, which releases the lock at once).
#[derive(Debug)]
pub struct Leadership {
    client: tokio_postgres::Client,
    connection: tokio::task::JoinHandle<()>,
    lease: Duration,
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl Leadership {
    /// Still leading: renew. An error (the session ended, no answer within
    /// a third of the lease) means the lock may be someone else's now.
    pub async fn renew(&self) -> Result<(), StoreError> {
        match tokio::time::timeout(self.lease / 3, self.client.simple_query("SELECT 1")).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(pg_error("renew the scheduler's lease")(e)),
            Err(_) => Err(StoreError::Postgres {
                op: "renew the scheduler's lease",
                message: format!("no answer within {:?}", self.lease / 3),
            }),
        }
    }
}

impl PgStore {
    /// Take the fleet's scheduling for `lease` if no one holds it; `None`
    /// when another scheduler leads.
    pub async fn try_lead(&self, lease: Duration) -> Result<Option<Leadership>, StoreError> {
        let failed = pg_error("take the fleet's scheduling");
        let (client, connection) = self
            .config
            .connect(self.tls.connector.clone())
            .await
            .map_err(&failed)?;
        let connection = tokio::spawn(async move {
            // Ends when the server closes the session or the handle drops.
            let _ = connection.await;
        });
        let timeout_ms = lease_ms(lease).max(1);
        let taken = async {
            client
                .batch_execute(&format!(
                    "SET idle_in_transaction_session_timeout = {timeout_ms}"
                ))
                .await?;
            client.batch_execute("BEGIN").await?;
            let row = client
                .query_one(
                    "SELECT pg_try_advisory_xact_lock($1, hashtext($2))",
                    &[&LEADER_LOCK_CLASS, &self.fleet()],
                )
                .await?;
            Ok::<bool, tokio_postgres::Error>(row.get(0))
        }
        .await;
        match taken {
            Ok(true) => Ok(Some(Leadership {
                client,
                connection,
                lease,
            })),
            Ok(false) => {
                connection.abort();
                Ok(None)
            }
            Err(e) => {
                connection.abort();
                Err(failed(e))
            }
        }
    }

    /// The fleet's stored values of `key` for every trigger.
    pub async fn trigger_values(
        &self,
        key: &str,
    ) -> Result<BTreeMap<String, serde_json::Value>, StoreError> {
        let failed = pg_error("read trigger state");
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT trigger, value FROM npc_trigger_state WHERE fleet = $1 AND key = $2",
                &[&self.fleet(), &key],
            )
            .await
            .map_err(&failed)?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let value: String = row.get(1);
                Some((row.get(0), serde_json::from_str(&value).ok()?))
            })
            .collect())
    }

    /// Forget trigger `trigger`'s `key` for the fleet (it was removed).
    pub async fn forget_trigger_value(&self, trigger: &str, key: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM npc_trigger_state WHERE fleet = $1 AND trigger = $2 AND key = $3",
                &[&self.fleet(), &trigger, &key],
            )
            .await
            .map_err(pg_error("forget trigger state"))?;
        Ok(())
    }

    /// Store trigger `trigger`'s `key` as `value` for the fleet.
    pub async fn set_trigger_value(
        &self,
        trigger: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO npc_trigger_state (fleet, trigger, key, value, updated_at_ms)
                 VALUES ($1, $2, $3, $4, npc_now_ms())
                 ON CONFLICT (fleet, trigger, key)
                 DO UPDATE SET value = EXCLUDED.value, updated_at_ms = EXCLUDED.updated_at_ms",
                &[&self.fleet(), &trigger, &key, &value.to_string()],
            )
            .await
            .map_err(pg_error("write trigger state"))?;
        Ok(())
    }
}
