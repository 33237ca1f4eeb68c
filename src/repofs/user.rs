//! The user's own places outside any repository: the data directory under
//! which npc keeps user-level files (the memory tools' notes, the notice
//! board, plugin data, the plugin registry). Only environment variables
//! the user set decide it, never a repository.

use std::path::PathBuf;

/// The user's data directory: `$XDG_DATA_HOME` when absolute, else
/// `$HOME/.local/share`; `None` when neither is usable.
pub fn user_data_dir() -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| {
        let p = PathBuf::from(v);
        p.is_absolute().then_some(p)
    };
    std::env::var_os("XDG_DATA_HOME")
        .and_then(absolute)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(absolute)
                .map(|h| h.join(".local/share"))
        })
}
