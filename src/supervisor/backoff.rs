//! The pure restart arithmetic of the supervisor: whether a restart policy
//! calls for a restart, the exponential backoff schedule (initial delay,
//! doubling, cap, reset after a clean run) and flap detection (too many
//! restarts within a sliding window). Time comes in as `Instant`s passed by
//! the caller, so tests drive it with a fake clock and never sleep.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::model::RestartPolicy;

use super::ExitInfo;

/// First restart delay.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Each further restart waits this many times longer than the previous one.
pub const DEFAULT_BACKOFF_FACTOR: u32 = 2;
/// Longest restart delay.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A child that ran at least this long before exiting restarts with the
/// initial delay again.
pub const DEFAULT_BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);
/// Width of the sliding window in which restarts are counted for flap detection.
pub const DEFAULT_FLAP_WINDOW: Duration = Duration::from_secs(300);
/// More restarts than this within [`DEFAULT_FLAP_WINDOW`] mark the child failed.
pub const DEFAULT_FLAP_MAX_RESTARTS: u32 = 5;

/// How restarts are spaced and when a child counts as flapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Delay before the first restart.
    pub initial: Duration,
    /// Multiplier applied to the delay for each consecutive restart.
    pub factor: u32,
    /// Upper bound of the delay.
    pub max: Duration,
    /// A run at least this long resets the delay to `initial`.
    pub reset_after: Duration,
    /// Window in which restarts are counted.
    pub flap_window: Duration,
    /// Restarts allowed within `flap_window`; one more marks the child failed.
    pub flap_max_restarts: u32,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            initial: DEFAULT_BACKOFF_INITIAL,
            factor: DEFAULT_BACKOFF_FACTOR,
            max: DEFAULT_BACKOFF_MAX,
            reset_after: DEFAULT_BACKOFF_RESET_AFTER,
            flap_window: DEFAULT_FLAP_WINDOW,
            flap_max_restarts: DEFAULT_FLAP_MAX_RESTARTS,
        }
    }
}

impl BackoffPolicy {
    /// The delay before restart number `attempt` (1-based) of a streak.
    pub fn delay(&self, attempt: u32) -> Duration {
        let mut delay = self.initial.min(self.max);
        for _ in 1..attempt {
            delay = delay.saturating_mul(self.factor.max(1));
            if delay >= self.max {
                return self.max;
            }
        }
        delay
    }
}

/// Whether `policy` asks for a restart after the child ended with `exit`.
pub fn wants_restart(policy: RestartPolicy, exit: &ExitInfo) -> bool {
    match policy {
        RestartPolicy::Never => false,
        RestartPolicy::OnFailure => !exit.success(),
        RestartPolicy::Always => true,
    }
}

/// What to do after a child exited and its policy wants a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Restart after `delay`; `attempt` counts restarts in the current streak.
    Restart { attempt: u32, delay: Duration },
    /// Too many restarts: `restarts` happened within `window` (limit `limit`).
    GiveUp {
        restarts: u32,
        window: Duration,
        limit: u32,
    },
}

/// Restart bookkeeping for one child.
#[derive(Debug, Clone)]
pub struct RestartTracker {
    policy: BackoffPolicy,
    /// Restarts in the current streak (reset by a clean run).
    streak: u32,
    /// When each restart within the flap window was decided.
    recent: VecDeque<Instant>,
}

impl RestartTracker {
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            streak: 0,
            recent: VecDeque::new(),
        }
    }

    /// The child that started at `started` exited at `now` and its policy
    /// wants a restart: decide the delay, or give up because it flaps.
    pub fn on_exit(&mut self, started: Instant, now: Instant) -> Decision {
        if now.saturating_duration_since(started) >= self.policy.reset_after {
            self.streak = 0;
        }
        while let Some(&first) = self.recent.front() {
            if now.saturating_duration_since(first) >= self.policy.flap_window {
                self.recent.pop_front();
            } else {
                break;
            }
        }
        let in_window = u32::try_from(self.recent.len()).unwrap_or(u32::MAX);
        if in_window >= self.policy.flap_max_restarts {
            return Decision::GiveUp {
                restarts: in_window,
                window: self.policy.flap_window,
                limit: self.policy.flap_max_restarts,
            };
        }
        self.streak = self.streak.saturating_add(1);
        self.recent.push_back(now);
        Decision::Restart {
            attempt: self.streak,
            delay: self.policy.delay(self.streak),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BackoffPolicy {
        BackoffPolicy {
            initial: Duration::from_secs(1),
            factor: 2,
            max: Duration::from_secs(10),
            reset_after: Duration::from_secs(30),
            flap_window: Duration::from_secs(100),
            flap_max_restarts: 4,
        }
    }

    #[test]
    fn delay_doubles_then_caps() {
        let p = policy();
        let delays: Vec<u64> = (1..=6).map(|a| p.delay(a).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        assert_eq!(p.delay(u32::MAX), p.max);
    }

    #[test]
    fn initial_above_cap_is_capped() {
        let p = BackoffPolicy {
            initial: Duration::from_secs(100),
            ..policy()
        };
        assert_eq!(p.delay(1), p.max);
    }

    #[test]
    fn restart_policy_matrix() {
        let ok = ExitInfo {
            code: Some(0),
            signal: None,
        };
        let bad = ExitInfo {
            code: Some(3),
            signal: None,
        };
        let killed = ExitInfo {
            code: None,
            signal: Some(9),
        };
        assert!(!wants_restart(RestartPolicy::Never, &bad));
        assert!(!wants_restart(RestartPolicy::OnFailure, &ok));
        assert!(wants_restart(RestartPolicy::OnFailure, &bad));
        assert!(wants_restart(RestartPolicy::OnFailure, &killed));
        assert!(wants_restart(RestartPolicy::Always, &ok));
    }

    #[test]
    fn quick_crashes_back_off_and_long_run_resets() {
        let mut t = RestartTracker::new(BackoffPolicy {
            flap_max_restarts: 100,
            ..policy()
        });
        let t0 = Instant::now();
        let mut now = t0;
        let mut seen = Vec::new();
        for _ in 0..3 {
            let started = now;
            now += Duration::from_secs(1);
            match t.on_exit(started, now) {
                Decision::Restart { attempt, delay } => seen.push((attempt, delay.as_secs())),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(seen, [(1, 1), (2, 2), (3, 4)]);
        // A clean run of `reset_after` starts the streak over.
        let started = now;
        now += Duration::from_secs(30);
        assert_eq!(
            t.on_exit(started, now),
            Decision::Restart {
                attempt: 1,
                delay: Duration::from_secs(1)
            }
        );
    }

    #[test]
    fn flapping_gives_up_with_counts() {
        let mut t = RestartTracker::new(policy());
        let mut now = Instant::now();
        for _ in 0..4 {
            let started = now;
            now += Duration::from_secs(1);
            assert!(matches!(t.on_exit(started, now), Decision::Restart { .. }));
        }
        let started = now;
        now += Duration::from_secs(1);
        assert_eq!(
            t.on_exit(started, now),
            Decision::GiveUp {
                restarts: 4,
                window: Duration::from_secs(100),
                limit: 4
            }
        );
    }

    #[test]
    fn restarts_outside_the_window_are_forgotten() {
        let mut t = RestartTracker::new(BackoffPolicy {
            reset_after: Duration::from_secs(1000),
            ..policy()
        });
        let mut now = Instant::now();
        for _ in 0..4 {
            let started = now;
            now += Duration::from_secs(40);
            assert!(matches!(t.on_exit(started, now), Decision::Restart { .. }));
        }
        // Restarts at 40, 80, 120, 160; at 200 the ones at 40 and 80 fell out.
        let started = now;
        now += Duration::from_secs(40);
        assert!(matches!(t.on_exit(started, now), Decision::Restart { .. }));
    }
}
