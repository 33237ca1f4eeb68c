//! The per-child monitor task: owns the child process, reaps it, answers stop
//! and signal requests while the pid is still valid, applies the restart
//! policy with backoff and flap detection, and publishes state changes and
//! events. It holds no reference to the supervisor itself, so dropping the
//! last `Supervisor` closes its control channel and the task kills the group.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::process::Child;
use tokio::sync::{mpsc, oneshot as once};
use tokio::time::{Instant, sleep_until};

use super::backoff::{Decision, RestartTracker, wants_restart};
use super::contain::Containment;
use super::spawn::{self, ChildSpec, GroupGuard, Signals, Spawned};
use super::{ChildPipes, ChildState, Control, ExitInfo, Shared, SupervisorError, SupervisorEvent};

/// Move the pipes of a freshly spawned child into the shared slot.
pub(super) fn stash_pipes(shared: &Shared, spawned: &mut Spawned) {
    let child = &mut spawned.child;
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let mut slot = super::lock(&shared.pipes);
    *slot = if stdin.is_some() || stdout.is_some() || stderr.is_some() {
        Some(ChildPipes {
            pid: spawned.pid,
            stdin,
            stdout,
            stderr,
        })
    } else {
        None
    };
}

/// How one incarnation of the child ended.
enum Ending {
    /// It exited on its own.
    Exited(ExitInfo),
    /// It was stopped on request; answer `done` once the state is recorded.
    Stopped(ExitInfo, once::Sender<()>),
    /// The supervisor is gone; the group was killed.
    Orphaned,
}

#[derive(Debug)]
pub(super) struct Monitor {
    pub(super) id: String,
    pub(super) spec: ChildSpec,
    pub(super) ready_grace: Duration,
    /// Answered when the first process passes `ready_grace` or exits before.
    pub(super) ready: Option<once::Sender<Result<(), ExitInfo>>>,
    pub(super) events: mpsc::UnboundedSender<SupervisorEvent>,
    pub(super) shared: Arc<Shared>,
    pub(super) control: mpsc::UnboundedReceiver<Control>,
    pub(super) tracker: RestartTracker,
    pub(super) contain: Option<Arc<Containment>>,
}

impl Monitor {
    fn emit(&self, event: SupervisorEvent) {
        let _ = self.events.send(event);
    }

    fn fail(&self, reason: String) {
        self.emit(SupervisorEvent::Failed {
            id: self.id.clone(),
            reason,
        });
    }

    fn stopped(&self, done: once::Sender<()>) {
        self.shared.set_state(ChildState::Stopped);
        self.emit(SupervisorEvent::Stopped {
            id: self.id.clone(),
        });
        let _ = done.send(());
    }

    /// Supervise `child` (whose group `guard` records) until it is stopped,
    /// given up on, or orphaned.
    pub(super) async fn run(mut self, mut spawned: Spawned, mut guard: GroupGuard) {
        loop {
            let pid = spawned.pid;
            let started = Instant::now();
            let ending = self
                .watch(&mut spawned.child, spawned.signals, started)
                .await;
            guard.disarm();
            // Every path below sets the next state before emitting `Exited`,
            // so a status read after any event is already up to date.
            let exit = match ending {
                Ending::Orphaned => return,
                Ending::Stopped(exit, done) => {
                    self.shared.set_state(ChildState::Stopped);
                    self.emit_exited(pid, exit);
                    self.stopped(done);
                    return;
                }
                Ending::Exited(exit) => exit,
            };
            if let Some(ready) = self.ready.take() {
                self.shared.set_state(ChildState::Failed);
                self.emit_exited(pid, exit);
                self.fail(format!(
                    "exited during its {:?} readiness grace with {exit}",
                    self.ready_grace
                ));
                let _ = ready.send(Err(exit));
                return;
            }
            if !wants_restart(self.spec.restart, &exit) {
                self.shared.set_state(ChildState::Exited);
                self.emit_exited(pid, exit);
                return;
            }
            let decision = self
                .tracker
                .on_exit(started.into_std(), Instant::now().into_std());
            let (attempt, delay) = match decision {
                Decision::Restart { attempt, delay } => (attempt, delay),
                Decision::GiveUp {
                    restarts,
                    window,
                    limit,
                } => {
                    self.shared.set_state(ChildState::Failed);
                    self.emit_exited(pid, exit);
                    self.fail(format!(
                        "flapping: restarted {restarts} times within {window:?} (limit {limit}) and exited again with {exit}; fix it and start it again"
                    ));
                    return;
                }
            };
            self.shared
                .update(|s| s.restarts = s.restarts.saturating_add(1));
            self.shared.set_state(ChildState::Backoff);
            self.emit_exited(pid, exit);
            self.emit(SupervisorEvent::Restarting {
                id: self.id.clone(),
                attempt,
                delay,
            });
            if let Some(done) = self.wait_backoff(delay).await {
                if let Some(done) = done {
                    self.stopped(done);
                }
                return;
            }
            match spawn::spawn_supervised(&self.id, &self.spec, self.contain.as_ref()) {
                Ok(mut next) => {
                    guard = GroupGuard::new(spawn::pgid_of(&next.child), self.contain.as_ref());
                    let pid = next.pid;
                    stash_pipes(&self.shared, &mut next);
                    self.shared.update(|s| s.pid = Some(pid));
                    self.shared.set_state(ChildState::Starting);
                    self.emit(SupervisorEvent::Started {
                        id: self.id.clone(),
                        pid,
                    });
                    spawned = next;
                }
                Err(e) => {
                    self.shared.set_state(ChildState::Failed);
                    self.fail(format!("restart failed: {e}"));
                    return;
                }
            }
        }
    }

    /// Wait out a backoff delay. `None`: time to restart. `Some(done)`: stop
    /// requested (answer `done`), or `Some(None)`: the supervisor is gone.
    async fn wait_backoff(&mut self, delay: Duration) -> Option<Option<once::Sender<()>>> {
        let until = Instant::now() + delay;
        loop {
            tokio::select! {
                () = sleep_until(until) => return None,
                cmd = self.control.recv() => match cmd {
                    Some(Control::Stop { done }) => return Some(Some(done)),
                    Some(Control::Signal { done, .. }) => {
                        let _ = done.send(Err(SupervisorError::NotRunning {
                            id: self.id.clone(),
                            state: ChildState::Backoff,
                        }));
                    }
                    None => return Some(None),
                },
            }
        }
    }

    /// Watch one incarnation until it exits, is stopped, or is orphaned.
    async fn watch(&mut self, child: &mut Child, signals: Signals, started: Instant) -> Ending {
        let pgid = spawn::pgid_of(child);
        let ready_at = started + self.ready_grace;
        let mut ready = false;
        let ending = loop {
            tokio::select! {
                status = child.wait() => {
                    break Ending::Exited(status.map(ExitInfo::from).unwrap_or_default());
                }
                () = sleep_until(ready_at), if !ready => {
                    ready = true;
                    self.shared.set_state(ChildState::Running);
                    if let Some(tx) = self.ready.take() {
                        let _ = tx.send(Ok(()));
                    }
                }
                cmd = self.control.recv() => match cmd {
                    Some(Control::Stop { done }) => {
                        let exit = spawn::stop_child(child, self.spec.stop_grace).await;
                        self.record_exit(exit);
                        return Ending::Stopped(exit, done);
                    }
                    Some(Control::Signal { signal, done }) => {
                        let _ = done.send(self.send_signal(child, signals, signal));
                    }
                    None => {
                        if let Some(pgid) = pgid {
                            spawn::kill_leftovers(pgid);
                        }
                        let _ = child.wait().await;
                        return Ending::Orphaned;
                    }
                },
            }
        };
        if let Ending::Exited(exit) = &ending {
            // The leader is gone; whatever it left in its group is an orphan.
            if let Some(pgid) = pgid {
                spawn::kill_leftovers(pgid);
            }
            self.record_exit(*exit);
        }
        ending
    }

    fn send_signal(
        &self,
        child: &Child,
        signals: Signals,
        signal: Signal,
    ) -> Result<(), SupervisorError> {
        signals
            .send(child, signal)
            .map_err(|source| SupervisorError::Signal {
                id: self.id.clone(),
                source,
            })
    }

    fn record_exit(&self, exit: ExitInfo) {
        self.shared.update(|s| {
            s.pid = None;
            s.last_exit = Some(exit);
        });
        *super::lock(&self.shared.pipes) = None;
    }

    fn emit_exited(&self, pid: u32, exit: ExitInfo) {
        self.emit(SupervisorEvent::Exited {
            id: self.id.clone(),
            pid,
            code: exit.code,
            signal: exit.signal,
        });
    }
}
