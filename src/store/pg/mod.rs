//! The PostgreSQL store, the fleet's backend: many machines share one run
//! queue and one event log (`tokio-postgres` through a `deadpool-postgres`
//! pool; the ONE module besides [`crate::store`]'s SQLite that talks to a
//! database). Rows are scoped by their fleet (a repository's project name
//! and remote URL), claims take `FOR UPDATE SKIP LOCKED`, an enqueue wakes
//! the fleet's workers by `NOTIFY` (a dedicated `LISTEN` connection; a
//! poll is the fallback), an event append wakes those who follow the
//! fleet's log the same way ([`PgStore::wait_for_events`]), and times come
//! from the database's clock.
//!
//! The URL is a secret (it holds a password): nothing here prints it, and
//! every error says what failed without quoting it. Every connection
//! goes through [`tls`]: rustls with libpq's `sslmode` and `sslrootcert`,
//! `verify-full` by default for any host but loopback.

mod acp;
pub mod approvals;
mod leader;
mod notices;
mod queue;
mod roster;
mod schema;
pub mod tls;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

pub use leader::Leadership;
pub use queue::{claim_statement, finish_statement};

use super::StoreError;

/// The schema version this build writes and reads.
pub const PG_SCHEMA_VERSION: i64 = 10;
/// Connections one process keeps to the store.
pub const POOL_SIZE: usize = 8;
/// How long connecting to the server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller waits for a pooled connection.
pub const POOL_WAIT: Duration = Duration::from_secs(10);
/// How long the server lets a session of this process sit in a transaction
/// with no statement before it ends the session: a worker paused (SIGSTOP)
/// or cut off mid-transaction would otherwise hold its row locks, and every
/// other worker's rescue would wait on them without end. npc's transactions
/// run their statements back to back, so a live one never comes near it.
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server runs one statement of this process before it
/// cancels it: below any lease, so a renewal never waits longer on the
/// server.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one call of the fleet's queue may take in all (a connection
/// from the pool, its statements, their answers) before it fails as the
/// store being unreachable: a stalled connection (a partition) never
/// holds a caller longer. A worker bounds its own calls tighter, by its
/// lease ([`crate::runs::fleet`]).
pub const CALL_DEADLINE: Duration = Duration::from_secs(15);
/// Idle time on a connection before TCP probes it, and the pause between
/// probes.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// Unanswered keepalive probes before TCP drops the connection.
pub const KEEPALIVE_RETRIES: u32 = 3;
/// How long sent data may stay unacknowledged before TCP drops the
/// connection (`TCP_USER_TIMEOUT`): a stalled peer is found within it.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
/// The `LISTEN` channel enqueues notify on; the payload is the fleet.
pub const WAKE_CHANNEL: &str = "npc_runs";
/// The `LISTEN` channel event appends notify on; the payload is the fleet.
pub const EVENTS_CHANNEL: &str = "npc_events";
/// The `LISTEN` channel a firing with overlap `replace` notifies on; the
/// payload is the replaced run's id.
pub const STOP_CHANNEL: &str = "npc_run_stops";
/// First pause before the listener connects again; it doubles per failure.
pub const LISTEN_BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Longest pause before the listener connects again.
pub const LISTEN_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Map a driver error to [`StoreError::Postgres`] for the named operation.
/// The driver's words never hold the URL or its password.
pub(super) fn pg_error(op: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |source| {
        let message = error_words(&source);
        if unanswered(&source) {
            StoreError::PgUnreachable { op, message }
        } else {
            StoreError::Postgres { op, message }
        }
    }
}

/// SQLSTATEs that say the server is not there to answer: its class `08`
/// (connection exception) is tested apart; these are `57P01`
/// (admin shutdown), `57P02` (crash shutdown), `57P03` (cannot connect
/// now: starting up or shutting down).
const UNANSWERED_STATES: [&str; 3] = ["57P01", "57P02", "57P03"];

/// Whether `error` says the server did not answer (the connection is
/// closed or failed, or the server is going away), not that it refused.
fn unanswered(error: &tokio_postgres::Error) -> bool {
    match error.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || UNANSWERED_STATES.contains(&code)
        }
        None => {
            error.is_closed()
                || std::error::Error::source(error)
                    .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some())
        }
    }
}

/// The driver's message with its cause (the server's words for a refused
/// login or a failed statement, npc's for a failed TLS handshake).
fn error_words(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => tls::tls_words(error).unwrap_or_else(|| error.to_string()),
    }
}

/// `call` (the named operation), failed as [`StoreError::PgUnreachable`]
/// when it takes longer than [`CALL_DEADLINE`].
pub(super) async fn bounded<T>(
    op: &'static str,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(CALL_DEADLINE, call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::PgUnreachable {
                op,
                message: format!("no answer within {CALL_DEADLINE:?}"),
            })
        })
}

fn pool_error(op: &'static str) -> impl Fn(deadpool_postgres::PoolError) -> StoreError {
    move |source| match source {
        deadpool_postgres::PoolError::Backend(e) => pg_error(op)(e),
        // No connection within the pool's wait: the server did not answer.
        deadpool_postgres::PoolError::Timeout(_) => StoreError::PgUnreachable {
            op,
            message: source.to_string(),
        },
        other => StoreError::Postgres {
            op,
            message: other.to_string(),
        },
    }
}

/// Parse a `postgres://` URL and its TLS parameters; the error never
/// quotes it.
fn config_of(url: &str) -> Result<(tokio_postgres::Config, tls::Tls), StoreError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(StoreError::PgUrl(
            "it does not start with `postgres://`".into(),
        ));
    }
    let parsed =
        crate::model::store_url::parse(url).map_err(|e| StoreError::PgUrl(e.to_string()))?;
    let mut config = tokio_postgres::Config::from_str(&parsed.rest)
        .map_err(|_| StoreError::PgUrl("it does not parse".into()))?;
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_IDLE)
        .keepalives_retries(KEEPALIVE_RETRIES)
        .tcp_user_timeout(TCP_USER_TIMEOUT);
    let bound = format!(
        "-c idle_in_transaction_session_timeout={} -c statement_timeout={}",
        IDLE_IN_TRANSACTION_TIMEOUT.as_millis(),
        STATEMENT_TIMEOUT.as_millis()
    );
    let options = match config.get_options() {
        Some(theirs) if !theirs.is_empty() => format!("{theirs} {bound}"),
        _ => bound,
    };
    config.options(&options);
    if config.get_application_name().is_none() {
        config.application_name("npc");
    }
    let mode = tls::effective_mode(parsed.sslmode, parsed.sslrootcert.as_ref(), &config);
    let (tls, driver_mode) = tls::tls_for(mode, parsed.sslrootcert.as_ref())?;
    config.ssl_mode(driver_mode);
    Ok((config, tls))
}

fn pool_of(config: tokio_postgres::Config, tls: &tls::Tls) -> Result<Pool, StoreError> {
    let manager = Manager::from_config(
        config,
        tls.connector.clone(),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(POOL_SIZE)
        .wait_timeout(Some(POOL_WAIT))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::PgUrl(e.to_string()))
}

/// Apply the store's missing migrations (`npc store migrate`); returns the
/// versions before and after.
pub async fn migrate(url: &str) -> Result<(i64, i64), StoreError> {
    let (config, tls) = config_of(url)?;
    let pool = pool_of(config, &tls)?;
    let mut client = pool.get().await.map_err(pool_error("connect"))?;
    schema::migrate(&mut client).await
}

/// A fleet's view of the PostgreSQL store. Share it as `Arc<PgStore>`.
#[derive(Debug)]
pub struct PgStore {
    pool: Pool,
    /// For connections of their own (the listener, the scheduler's lock).
    config: tokio_postgres::Config,
    tls: tls::Tls,
    fleet: String,
    wake: Arc<tokio::sync::Notify>,
    /// Ids of running runs marked replaced, as notified.
    stops: tokio::sync::broadcast::Sender<String>,
    listener: tokio::task::JoinHandle<()>,
    /// Signalled by appends to the fleet's event log, once someone follows it.
    events_wake: Arc<tokio::sync::Notify>,
    /// The `LISTEN` of [`EVENTS_CHANNEL`], started by the first follower.
    events_listener: std::sync::OnceLock<tokio::task::JoinHandle<()>>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.listener.abort();
        if let Some(listener) = self.events_listener.get() {
            listener.abort();
        }
    }
}

impl PgStore {
    /// Connect to the store at `url` as fleet `fleet`: the server must be
    /// reachable and the schema at [`PG_SCHEMA_VERSION`] (else the error
    /// says to run `npc store migrate`).
    pub async fn connect(url: &str, fleet: &str) -> Result<Self, StoreError> {
        let (config, tls) = config_of(url)?;
        let pool = pool_of(config.clone(), &tls)?;
        {
            let client = pool.get().await.map_err(pool_error("connect"))?;
            schema::check_version(&client).await?;
        }
        let wake = Arc::new(tokio::sync::Notify::new());
        let stops = tokio::sync::broadcast::channel(crate::store::fleet::STOP_REQUEST_BACKLOG).0;
        let (listening, subscribed) = tokio::sync::oneshot::channel();
        let heard = Heard {
            fleet: fleet.to_string(),
            channels: &[WAKE_CHANNEL, STOP_CHANNEL],
            wake: wake.clone(),
            stops: Some(stops.clone()),
            listening: Some(listening),
        };
        let listener = tokio::spawn(listen(config.clone(), tls.clone(), heard));
        // Listening before the first claim, so no notification of the
        // fleet's after the connect is missed (the poll covers a failure).
        let _ = tokio::time::timeout(CONNECT_TIMEOUT, subscribed).await;
        Ok(Self {
            pool,
            config,
            tls,
            fleet: fleet.to_string(),
            wake,
            stops,
            listener,
            events_wake: Arc::default(),
            events_listener: std::sync::OnceLock::new(),
        })
    }

    /// Whether the store answers, within [`CALL_DEADLINE`], at the schema
    /// version this build reads: checked again after every outage, so a
    /// store migrated while this process could not reach it is refused
    /// (the error says which version and what to do), never used.
    pub async fn check(&self) -> Result<(), StoreError> {
        bounded("check the store", async {
            let client = self.client().await?;
            schema::check_version(&client).await
        })
        .await
    }

    /// The fleet this view reads and writes.
    pub fn fleet(&self) -> &str {
        &self.fleet
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_error("connect"))
    }

    /// Resolve when an event may have been appended to the fleet's log, or
    /// after `at_most` (the poll that covers a lost notification). The
    /// first call starts listening; an append since the last call wakes it
    /// at once.
    pub async fn wait_for_append(&self, at_most: Duration) {
        self.events_listener.get_or_init(|| {
            tokio::spawn(listen(
                self.config.clone(),
                self.tls.clone(),
                Heard {
                    fleet: self.fleet.clone(),
                    channels: &[EVENTS_CHANNEL],
                    wake: self.events_wake.clone(),
                    stops: None,
                    listening: None,
                },
            ))
        });
        let _ = tokio::time::timeout(at_most, self.events_wake.notified()).await;
    }
}

/// Where a listener passes what it hears.
struct Heard {
    fleet: String,
    /// The channels it listens on.
    channels: &'static [&'static str],
    /// Signalled for every notification of the fleet on them.
    wake: Arc<tokio::sync::Notify>,
    /// Sent every replaced run's id, when it listens on [`STOP_CHANNEL`].
    stops: Option<tokio::sync::broadcast::Sender<String>>,
    /// Told once the first `LISTEN` holds.
    listening: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Keep a `LISTEN` connection open and pass on every notification of the
/// fleet (an enqueue or an append wakes, a replaced run is a stop request);
/// connect again with backoff when it drops.
async fn listen(config: tokio_postgres::Config, tls: tls::Tls, heard: Heard) {
    let Heard {
        fleet,
        channels,
        wake,
        stops,
        listening: mut first_listen,
    } = heard;
    use futures_util::StreamExt;
    let statement = channels
        .iter()
        .map(|c| format!("LISTEN {c}"))
        .collect::<Vec<_>>()
        .join("; ");
    let mut backoff = LISTEN_BACKOFF_INITIAL;
    loop {
        if let Ok((client, mut connection)) = config.connect(tls.connector.clone()).await {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            let listening = async { client.batch_execute(&statement).await.is_ok() };
            // The connection must be polled for the LISTEN to complete.
            let mut subscribed = std::pin::pin!(listening);
            let ok = loop {
                tokio::select! {
                    done = &mut subscribed => break done,
                    message = messages.next() => if message.is_none_or(|m| m.is_err()) { break false },
                }
            };
            if ok {
                backoff = LISTEN_BACKOFF_INITIAL;
                if let Some(told) = first_listen.take() {
                    let _ = told.send(());
                }
                // A wake-up may have been missed while not listening.
                wake.notify_one();
                while let Some(Ok(message)) = messages.next().await {
                    let tokio_postgres::AsyncMessage::Notification(n) = message else {
                        continue;
                    };
                    if n.channel() == STOP_CHANNEL {
                        // A worker holding no such run ignores it.
                        if let Some(stops) = &stops {
                            let _ = stops.send(n.payload().to_string());
                        }
                    } else if n.payload() == fleet {
                        wake.notify_one();
                    }
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(LISTEN_BACKOFF_MAX);
    }
}
