//! The clock triggers read: the system clock in the daemon (shifted by
//! `NPC_CLOCK_OFFSET_SECS` when set — a test seam read from the daemon's
//! environment, never from a repository), a [`FakeClock`] in unit tests, so
//! no test waits for wall-clock minutes.

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use futures_util::future::BoxFuture;

/// Environment variable shifting the daemon's trigger clock, in seconds.
pub const CLOCK_OFFSET_ENV: &str = "NPC_CLOCK_OFFSET_SECS";
/// Longest single sleep of the system clock before it looks at the time
/// again (a suspended machine or a clock step is noticed this soon).
pub const MAX_SLEEP: Duration = Duration::from_secs(30);

/// Now, and a way to wait for a moment.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> DateTime<Utc>;
    /// Resolves at or after `at` by this clock.
    fn sleep_until(&self, at: DateTime<Utc>) -> BoxFuture<'_, ()>;
}

/// The system clock, plus a fixed offset.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock {
    offset: chrono::Duration,
}

impl SystemClock {
    /// The system clock shifted by [`CLOCK_OFFSET_ENV`] (0 when unset or
    /// not a whole number of seconds).
    pub fn from_env() -> Self {
        let secs = std::env::var(CLOCK_OFFSET_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .unwrap_or(0);
        Self {
            offset: chrono::Duration::seconds(secs),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.offset
    }

    fn sleep_until(&self, at: DateTime<Utc>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                let left = (at - self.now()).to_std().unwrap_or(Duration::ZERO);
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left.min(MAX_SLEEP)).await;
            }
        })
    }
}

/// A clock that moves only when told ([`FakeClock::set`]).
#[derive(Debug)]
pub struct FakeClock {
    now: Mutex<DateTime<Utc>>,
    moved: Notify,
}

impl FakeClock {
    pub fn new(now: DateTime<Utc>) -> Self {
        Self {
            now: Mutex::new(now),
            moved: Notify::new(),
        }
    }

    /// Move to `now`, waking every sleeper.
    pub fn set(&self, now: DateTime<Utc>) {
        *crate::stdx::lock(&self.now) = now;
        self.moved.notify_waiters();
    }
}

impl Clock for FakeClock {
    fn now(&self) -> DateTime<Utc> {
        *crate::stdx::lock(&self.now)
    }

    fn sleep_until(&self, at: DateTime<Utc>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                let moved = self.moved.notified();
                if self.now() >= at {
                    return;
                }
                moved.await;
            }
        })
    }
}
