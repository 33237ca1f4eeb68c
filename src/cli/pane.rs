//! `npc pane …`: list, open, close, send to and attach to the panes of the
//! running daemon, all through its control socket. `attach` puts the
//! terminal in raw mode, forwards keys and size changes, and detaches on
//! [`DETACH_KEY`] (Ctrl-]) or when the pane ends; the terminal is restored
//! however the session ends. The pane's output reaches the terminal as it
//! is (it is a terminal session) but for OSC 52 clipboard writes, which are
//! dropped ([`crate::stdx::term::OscFilter`]) unless `--clipboard` lets the
//! program in the pane set the clipboard (tmux's `set-clipboard on`).

use std::io::{Read as _, Write as _};
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Subcommand;

use super::reconcile::{daemon_socket, locate, tokio};
use super::{Exit, Format};
use crate::stdx::term::{OscFilter, printable};
use crate::surfaces::control::{
    AttachInput, Client, ControlError, Reply, Request, connect_upgrade,
};

/// The byte that detaches an attached terminal: Ctrl-] (as in telnet).
pub const DETACH_KEY: u8 = 0x1d;
/// How often an attached client looks at its terminal's size.
pub const RESIZE_POLL: std::time::Duration = std::time::Duration::from_millis(250);

#[derive(Debug, Subcommand)]
pub enum PaneCommand {
    /// Each pane: state, generation, pid, watcher, last status report
    List {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Open a pane of the manifest (panes also open when the daemon starts)
    Open {
        name: String,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
    /// Close a pane (its process is hung up)
    Close {
        name: String,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
    /// Type TEXT into a pane, then Enter
    Send {
        name: String,
        text: String,
        /// Do not press Enter after TEXT
        #[arg(long)]
        no_enter: bool,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
    /// Attach this terminal to a pane; Ctrl-] detaches
    Attach {
        name: String,
        /// Let the program in the pane set this terminal's clipboard (OSC 52
        /// sequences, dropped without this flag)
        #[arg(long)]
        clipboard: bool,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
}

/// The control socket of the daemon running for the repository.
fn socket(manifest: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let paths = locate(manifest)?;
    let (socket, _) = daemon_socket(&paths).context(
        "no daemon runs for this repository; panes run in the daemon: start it with `npc daemon`",
    )?;
    Ok(socket)
}

fn call(manifest: Option<PathBuf>, request: Request) -> anyhow::Result<Reply> {
    let socket = socket(manifest)?;
    Ok(tokio()?.block_on(Client::call(&socket, &request))?)
}

pub fn run(command: PaneCommand) -> anyhow::Result<Exit> {
    match command {
        PaneCommand::List { manifest, format } => {
            let panes = match call(manifest, Request::PaneList)? {
                Reply::Panes { panes } => panes,
                other => return Err(ControlError::unexpected(&other).into()),
            };
            match format {
                Format::Json => {
                    outln!("{}", serde_json::json!({ "panes": panes }))?;
                }
                Format::Human => {
                    if panes.is_empty() {
                        outln!("no panes; add a `[panes.NAME]` entry to the manifest")?;
                    }
                    for p in &panes {
                        let mut line = format!(
                            "{:<16} {:<8}",
                            p["name"].as_str().unwrap_or(""),
                            p["state"].as_str().unwrap_or("")
                        );
                        if let Some(g) = p["generation"].as_u64() {
                            line.push_str(&format!(" gen {g}"));
                        }
                        if let Some(pid) = p["pid"].as_u64() {
                            line.push_str(&format!(" pid {pid}"));
                        }
                        if let Some(w) = p["watcher"].as_str() {
                            line.push_str(&format!(" watched by {w}"));
                        }
                        if let Some(s) = p["status"]["state"].as_str() {
                            line.push_str(&format!(" [{s}"));
                            if let Some(d) = p["status"]["detail"].as_str() {
                                line.push_str(&format!(": {d}"));
                            }
                            if let Some(at) = p["status"]["deadline_epoch"].as_i64() {
                                let until = super::human::when(at.checked_mul(1000));
                                line.push_str(&format!(", until {until}"));
                            }
                            line.push(']');
                        }
                        outln!("{}", printable(&line))?;
                    }
                }
            }
            Ok(Exit::Ok)
        }
        PaneCommand::Open { name, manifest } => {
            let opened = match call(manifest, Request::PaneOpen { name: name.clone() })? {
                Reply::PaneOpened { opened } => opened,
                other => return Err(ControlError::unexpected(&other).into()),
            };
            outln!(
                "opened pane `{name}` (pid {})",
                opened["pid"].as_u64().unwrap_or_default()
            )?;
            Ok(Exit::Ok)
        }
        PaneCommand::Close { name, manifest } => {
            call(manifest, Request::PaneClose { name: name.clone() })?;
            outln!("closed pane `{name}`")?;
            Ok(Exit::Ok)
        }
        PaneCommand::Send {
            name,
            mut text,
            no_enter,
            manifest,
        } => {
            if !no_enter {
                text.push('\r');
            }
            call(manifest, Request::PaneSend { name, text })?;
            Ok(Exit::Ok)
        }
        PaneCommand::Attach {
            name,
            clipboard,
            manifest,
        } => attach(manifest, name, clipboard),
    }
}

/// The terminal's size, if stdin is one.
fn terminal_size() -> Option<(u16, u16)> {
    let size = rustix::termios::tcgetwinsize(rustix::stdio::stdin()).ok()?;
    (size.ws_row > 0 && size.ws_col > 0).then_some((size.ws_row, size.ws_col))
}

/// Puts stdin in raw mode while alive; restores it when dropped.
struct RawMode(Option<rustix::termios::Termios>);

impl RawMode {
    fn enter() -> Self {
        let stdin = rustix::stdio::stdin();
        let Ok(saved) = rustix::termios::tcgetattr(stdin) else {
            return Self(None); // not a terminal: pass bytes through as they are
        };
        let mut raw = saved.clone();
        raw.make_raw();
        let _ = rustix::termios::tcsetattr(stdin, rustix::termios::OptionalActions::Now, &raw);
        Self(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = rustix::termios::tcsetattr(
                rustix::stdio::stdin(),
                rustix::termios::OptionalActions::Now,
                saved,
            );
        }
    }
}

/// Attach to pane `name`; OSC 52 reaches the terminal only with `clipboard`.
fn attach(manifest: Option<PathBuf>, name: String, clipboard: bool) -> anyhow::Result<Exit> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let socket = socket(manifest)?;
    let rt = tokio()?;
    let (rows, cols) =
        terminal_size().unwrap_or((crate::panes::DEFAULT_ROWS, crate::panes::DEFAULT_COLS));
    let request = Request::PaneAttach {
        name: name.clone(),
        rows,
        cols,
    };
    let (mut read, mut write, answer) = rt.block_on(connect_upgrade(&socket, &request))?;
    let Reply::Attached { status, .. } = answer else {
        return Err(ControlError::unexpected(&answer).into());
    };
    let status = status.unwrap_or_default();
    if let Some(state) = status["state"].as_str() {
        let detail = status["detail"].as_str().unwrap_or("");
        errln!("[npc: pane `{name}` reports {state}: {detail}]");
    }
    let raw = RawMode::enter();
    // Keys: a blocking thread reads stdin and hands chunks over.
    let (keys_tx, mut keys_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if keys_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let ended = rt.block_on(async move {
        let mut out = [0u8; 16 * 1024];
        let mut filter = (!clipboard).then(OscFilter::new);
        let mut shown = Vec::with_capacity(out.len());
        let mut size = (rows, cols);
        let mut poll = tokio::time::interval(RESIZE_POLL);
        loop {
            tokio::select! {
                n = read.read(&mut out) => match n {
                    Ok(0) | Err(_) => return "the pane ended",
                    Ok(n) => {
                        let bytes = match filter.as_mut() {
                            Some(filter) => {
                                shown.clear();
                                filter.feed(&out[..n], &mut shown);
                                shown.as_slice()
                            }
                            None => &out[..n],
                        };
                        let mut stdout = std::io::stdout().lock();
                        if stdout.write_all(bytes).and_then(|()| stdout.flush()).is_err() {
                            return "the terminal closed";
                        }
                    }
                },
                keys = keys_rx.recv() => {
                    let Some(mut keys) = keys else { return "input ended" };
                    let detach = keys.iter().position(|&b| b == DETACH_KEY);
                    if let Some(i) = detach {
                        keys.truncate(i);
                    }
                    if !keys.is_empty() {
                        let line = serde_json::to_string(&AttachInput::Input(hex::encode(&keys))).unwrap_or_default() + "\n";
                        if write.write_all(line.as_bytes()).await.is_err() {
                            return "the daemon closed the session";
                        }
                    }
                    if detach.is_some() {
                        return "detached";
                    }
                }
                _ = poll.tick() => {
                    if let Some(now) = terminal_size() && now != size {
                        size = now;
                        let line = serde_json::to_string(&AttachInput::Resize { rows: now.0, cols: now.1 }).unwrap_or_default() + "\n";
                        let _ = write.write_all(line.as_bytes()).await;
                    }
                }
            }
        }
    });
    drop(raw);
    // The terminal is cooked again: a newline starts a line at its left.
    errln!("\n[npc: {ended} from pane `{name}`]");
    // The key thread may still block on stdin: end without waiting for it.
    rt.shutdown_background();
    Ok(Exit::Ok)
}
