//! The runtime: one object per canonical repository path that composes the
//! store, the event bus and the supervisor, and the reconcile loop that
//! applies plans to them (rolling a failed component back).

pub mod lock;
pub mod watch;
