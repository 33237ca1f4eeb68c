//! Panes and pane plugins: interactive agent CLIs in PTYs that npc hosts
//! (`[panes.*]`, `npc pane …`), and plugin children (`[pane_plugins.*]`)
//! that watch them over the NDJSON protocol v3 ([`protocol`]) and may act
//! on them only through the [`guard`]. The core never interprets provider
//! names or output; provider knowledge lives in plugins (npc ships one,
//! `npc-recovery`, in [`recovery`]). Panes keep running when a plugin is
//! absent or fails. The daemon's runtime reaches all of this through
//! [`PaneHost`], the driver of both kinds.

pub mod ansi;
pub mod attach;
pub mod guard;
mod host;
pub mod outbox;
pub mod pane;
pub mod plugin;
pub mod protocol;
pub mod recovery;

pub use host::{
    Attached, CLOSE_GRACE, DEFAULT_COLS, DEFAULT_ROWS, MAX_PANES, MAX_USER_INPUT_BYTES,
    NEEDS_ATTENTION, Notice, PANE_RUNTIME_DIR, PaneHost, PaneInfo, TICK,
};

/// The pane's random token, injected only into the pane's own environment.
pub const PANE_TOKEN_ENV: &str = "NPC_PANE_TOKEN";
/// The pane's name.
pub const PANE_NAME_ENV: &str = "NPC_PANE_NAME";
/// The pane's generation (1, then one more per relaunch).
pub const PANE_GENERATION_ENV: &str = "NPC_PANE_GENERATION";
/// A private directory for helpers inside panes; its last path component
/// is the repository's hub key (the memory file's project key).
pub const PLUGIN_RUNTIME_DIR_ENV: &str = "NPC_PLUGIN_RUNTIME_DIR";

/// Why a pane operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaneError {
    #[error("no pane `{0}` in the manifest; add a `[panes.{0}]` entry")]
    Unknown(String),
    #[error("pane `{0}` is already open; close it first with `npc pane close {0}`")]
    AlreadyOpen(String),
    #[error("pane `{0}` is not open; open it with `npc pane open {0}`")]
    NotOpen(String),
    #[error("pane `{0}` has exited; open it again with `npc pane open {0}`")]
    Exited(String),
    #[error("cannot start pane `{name}`: {error}")]
    Start { name: String, error: String },
    #[error("{MAX_PANES} panes are open already; close one first")]
    TooMany,
    #[error("input longer than {MAX_USER_INPUT_BYTES} bytes; send it in parts")]
    InputTooLong,
    #[error("the daemon is stopping")]
    Stopping,
    #[error("pane i/o: {0}")]
    Io(String),
}
