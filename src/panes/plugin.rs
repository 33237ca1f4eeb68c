//! A pane-plugin child: started through the supervisor with piped stdio,
//! fed host events from its [`Outbox`] on stdin, and read line by line on
//! stdout (lines cut at the protocol's bound, decoded for shape only). The
//! reader hands decoded lines to the host with at most
//! [`COMMANDS_IN_FLIGHT`] of this plugin's lines waiting at once, and
//! throttles a flooding plugin (at most [`COMMANDS_PER_SECOND`] lines a
//! second, in bursts of [`COMMAND_BURST`]): past either it stops reading,
//! so the plugin blocks on its own full pipe, npc's memory stays flat, and
//! one flooding plugin never crowds out another's lines.
//! This module never touches a pane: what a command does is the guard's
//! and the host's business.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::outbox::Outbox;
use super::protocol::{self, DecodeError, HostEvent, PROTOCOL_VERSION, PluginCommand};
use crate::supervisor::{ChildSpec, ExitInfo, GroupKiller, Supervisor, SupervisorError};

/// Lines a plugin may send per second before its reader slows down.
pub const COMMANDS_PER_SECOND: u32 = 200;
/// Lines a plugin may send at once before the rate applies.
pub const COMMAND_BURST: u32 = 400;
/// Decoded lines of one plugin waiting for the host at once; its reader
/// waits for the host before reading more. Each plugin has its own budget,
/// so the host's queue holds at most this many lines per plugin child.
pub const COMMANDS_IN_FLIGHT: usize = 16;
/// How long a plugin has to exit after `shutdown` before its group is killed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Pause between looks at a stopping plugin.
pub const STOP_POLL: Duration = Duration::from_millis(10);
/// Longest stderr line of a plugin copied into npc's log.
pub const MAX_STDERR_LINE: usize = 4096;

/// What a plugin's reader hands the host.
#[derive(Debug)]
pub enum PluginMsg {
    Line {
        plugin: String,
        instance: u64,
        line: Result<PluginCommand, DecodeError>,
        /// One of the plugin's [`COMMANDS_IN_FLIGHT`]; released once the
        /// host has handled the line.
        permit: OwnedSemaphorePermit,
    },
    Exited {
        plugin: String,
        instance: u64,
        exit: Option<ExitInfo>,
    },
}

/// A running plugin child.
#[derive(Debug)]
pub struct PluginChild {
    pub instance: u64,
    pub pid: u32,
    pub outbox: Arc<Outbox>,
    killer: GroupKiller,
}

impl PluginChild {
    /// Start `spec` as plugin `name`; its lines go to `to_host`.
    pub fn start(
        supervisor: &Supervisor,
        name: &str,
        instance: u64,
        spec: &ChildSpec,
        to_host: mpsc::UnboundedSender<PluginMsg>,
    ) -> Result<Self, SupervisorError> {
        let mut child = supervisor.spawn_streaming_lines(spec, protocol::MAX_LINE_BYTES)?;
        let pid = child.pid();
        let killer = child.killer();
        let outbox = Arc::new(Outbox::default());
        // Writer: host events to stdin, in order.
        if let Some(mut stdin) = child.stdin.take() {
            let outbox = outbox.clone();
            tokio::spawn(async move {
                while let Some(batch) = outbox.next_batch().await {
                    let mut bytes = Vec::new();
                    for event in &batch {
                        bytes.extend(protocol::encode_event(event));
                    }
                    if stdin.write_all(&bytes).await.is_err() || stdin.flush().await.is_err() {
                        return;
                    }
                }
            });
        }
        // Stderr: into npc's log, bounded per line.
        let mut stderr = std::mem::replace(&mut child.stderr, mpsc::channel(1).1);
        let who = name.to_string();
        tokio::spawn(async move {
            while let Some(line) = stderr.recv().await {
                let text: String = line.text().chars().take(MAX_STDERR_LINE).collect();
                tracing::info!("pane plugin `{who}` (stderr): {text}");
            }
        });
        // Reader: stdout lines, decoded and throttled.
        let mut stdout = std::mem::replace(&mut child.stdout, mpsc::channel(1).1);
        let plugin = name.to_string();
        let in_flight = Arc::new(Semaphore::new(COMMANDS_IN_FLIGHT));
        tokio::spawn(async move {
            let mut bucket = Bucket::new(std::time::Instant::now());
            while let Some(line) = stdout.recv().await {
                bucket.take().await;
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    break;
                };
                let decoded = match protocol::decode_command(&line.bytes, line.truncated) {
                    Ok(None) => continue,
                    Ok(Some(cmd)) => Ok(cmd),
                    Err(e) => Err(e),
                };
                let msg = PluginMsg::Line {
                    plugin: plugin.clone(),
                    instance,
                    line: decoded,
                    permit,
                };
                if to_host.send(msg).is_err() {
                    break;
                }
            }
            let exit = child.wait().await.ok();
            let _ = to_host.send(PluginMsg::Exited {
                plugin,
                instance,
                exit,
            });
        });
        Ok(Self {
            instance,
            pid,
            outbox,
            killer,
        })
    }

    /// Send `shutdown` and close its stdin, give the plugin
    /// [`SHUTDOWN_GRACE`] to exit, then kill its group; returns once it is gone.
    pub async fn stop(self) {
        self.outbox.event(HostEvent::Shutdown {
            v: PROTOCOL_VERSION,
        });
        self.outbox.close();
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        while self.is_running() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(STOP_POLL).await;
        }
        let _ = self.killer.kill();
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        while self.is_running() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(STOP_POLL).await;
        }
    }

    /// Whether the plugin's process still runs.
    pub fn is_running(&self) -> bool {
        i32::try_from(self.pid)
            .is_ok_and(|p| crate::supervisor::group_exists(nix::unistd::Pid::from_raw(p)))
    }

    /// Kill the plugin's group now (the daemon is stopping).
    pub fn kill(&self) {
        self.outbox.close();
        let _ = self.killer.kill();
    }
}

/// A token bucket: [`COMMAND_BURST`] at once, then [`COMMANDS_PER_SECOND`].
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: std::time::Instant,
}

impl Bucket {
    fn new(now: std::time::Instant) -> Self {
        Self {
            tokens: f64::from(COMMAND_BURST),
            last: now,
        }
    }

    /// Take one token at `now`: how long to wait before using it.
    fn take_at(&mut self, now: std::time::Instant) -> Duration {
        let rate = f64::from(COMMANDS_PER_SECOND);
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(COMMAND_BURST));
        self.last = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / rate)
        }
    }

    /// Take one token, waiting for it when the bucket is empty.
    async fn take(&mut self) {
        let wait = self.take_at(std::time::Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long a test waits for the reader to do something.
    const WAIT: Duration = Duration::from_secs(20);

    async fn queued_lines(rx: &mpsc::UnboundedReceiver<PluginMsg>, n: usize) {
        tokio::time::timeout(WAIT, async {
            while rx.len() < n {
                tokio::time::sleep(STOP_POLL).await;
            }
        })
        .await
        .expect("the reader queued the lines");
    }

    #[tokio::test]
    async fn a_flooding_plugin_has_at_most_its_own_budget_of_lines_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let (events, _events_rx) = mpsc::unbounded_channel();
        let supervisor = Supervisor::new(events, Default::default());
        let mut spec = ChildSpec::new("sh", dir.path());
        let line = r#"{"v":3,"cmd":"log","level":"info","message":"flood"}"#;
        spec.args = vec!["-c".into(), format!("while :; do echo '{line}'; done")];
        let (to_host, mut rx) = mpsc::unbounded_channel();
        let child = PluginChild::start(&supervisor, "flood", 1, &spec, to_host).unwrap();
        queued_lines(&rx, COMMANDS_IN_FLIGHT).await;
        // The plugin keeps writing, but nothing more is read for the host
        // until the host handles a line.
        for _ in 0..20 {
            tokio::time::sleep(STOP_POLL).await;
            assert_eq!(rx.len(), COMMANDS_IN_FLIGHT);
        }
        let first = rx.recv().await.unwrap();
        assert!(matches!(first, PluginMsg::Line { line: Ok(_), .. }));
        drop(first);
        queued_lines(&rx, COMMANDS_IN_FLIGHT).await;
        assert_eq!(rx.len(), COMMANDS_IN_FLIGHT);
        child.kill();
    }

    #[test]
    fn a_flood_is_slowed_to_the_rate() {
        let start = std::time::Instant::now();
        let mut b = Bucket::new(start);
        for _ in 0..COMMAND_BURST {
            assert_eq!(b.take_at(start), Duration::ZERO);
        }
        // Past the burst, each line waits one more interval.
        let waits: Vec<Duration> = (0..3).map(|_| b.take_at(start)).collect();
        let step = Duration::from_secs_f64(1.0 / f64::from(COMMANDS_PER_SECOND));
        assert!(waits[0] > Duration::ZERO && waits[1] > waits[0] && waits[2] > waits[1]);
        assert!(waits[2] >= step * 2);
        // A second later the bucket has refilled by the rate.
        let later = start + Duration::from_secs(1);
        assert_eq!(b.take_at(later), Duration::ZERO);
    }
}
