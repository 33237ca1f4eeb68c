//! A pane-plugin child: started through the supervisor with piped stdio,
//! fed host events from its [`Outbox`] on stdin, and read line by line on
//! stdout (lines cut at the protocol's bound, decoded for shape only). The
//! reader hands decoded lines to the host through a bounded queue and
//! throttles a flooding plugin (at most [`COMMANDS_PER_SECOND`] lines a
//! second, in bursts of [`COMMAND_BURST`]): past that it stops reading, so
//! the plugin blocks on its own full pipe and npc's memory stays flat.
//! This module never touches a pane: what a command does is the guard's
//! and the host's business.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;

use super::outbox::Outbox;
use super::protocol::{self, DecodeError, HostEvent, PROTOCOL_VERSION, PluginCommand};
use crate::supervisor::{ChildSpec, ExitInfo, GroupKiller, Supervisor, SupervisorError};

/// Lines a plugin may send per second before its reader slows down.
pub const COMMANDS_PER_SECOND: u32 = 200;
/// Lines a plugin may send at once before the rate applies.
pub const COMMAND_BURST: u32 = 400;
/// Decoded lines queued from all plugins to the host.
pub const COMMAND_QUEUE: usize = 64;
/// How long a plugin has to exit after `shutdown` before its group is killed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Longest stderr line of a plugin copied into npc's log.
pub const MAX_STDERR_LINE: usize = 4096;

/// What a plugin's reader hands the host.
#[derive(Debug)]
pub enum PluginMsg {
    Line {
        plugin: String,
        instance: u64,
        line: Result<PluginCommand, DecodeError>,
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
        to_host: mpsc::Sender<PluginMsg>,
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
        tokio::spawn(async move {
            let mut bucket = Bucket::new();
            while let Some(line) = stdout.recv().await {
                bucket.take().await;
                let decoded = match protocol::decode_command(&line.bytes, line.truncated) {
                    Ok(None) => continue,
                    Ok(Some(cmd)) => Ok(cmd),
                    Err(e) => Err(e),
                };
                let msg = PluginMsg::Line {
                    plugin: plugin.clone(),
                    instance,
                    line: decoded,
                };
                if to_host.send(msg).await.is_err() {
                    break;
                }
            }
            let exit = child.wait().await.ok();
            let _ = to_host
                .send(PluginMsg::Exited {
                    plugin,
                    instance,
                    exit,
                })
                .await;
        });
        Ok(Self {
            instance,
            pid,
            outbox,
            killer,
        })
    }

    /// Send `shutdown`, give the plugin [`SHUTDOWN_GRACE`], then kill its group.
    pub fn stop(self) {
        self.outbox.event(HostEvent::Shutdown {
            v: PROTOCOL_VERSION,
        });
        self.outbox.close();
        let killer = self.killer;
        tokio::spawn(async move {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
            let _ = killer.kill();
        });
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
    last: tokio::time::Instant,
}

impl Bucket {
    fn new() -> Self {
        Self {
            tokens: f64::from(COMMAND_BURST),
            last: tokio::time::Instant::now(),
        }
    }

    /// Take one token, waiting for it when the bucket is empty.
    async fn take(&mut self) {
        let now = tokio::time::Instant::now();
        let rate = f64::from(COMMANDS_PER_SECOND);
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * rate)
            .min(f64::from(COMMAND_BURST));
        self.last = now;
        if self.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / rate);
            tokio::time::sleep(wait).await;
            self.tokens = 1.0;
            self.last = tokio::time::Instant::now();
        }
        self.tokens -= 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_flood_is_slowed_to_the_rate() {
        let mut b = Bucket::new();
        let start = tokio::time::Instant::now();
        for _ in 0..COMMAND_BURST {
            b.take().await;
        }
        assert!(start.elapsed() < Duration::from_millis(10));
        for _ in 0..COMMANDS_PER_SECOND {
            b.take().await;
        }
        assert!(start.elapsed() >= Duration::from_millis(990));
    }
}
