//! Files editors (and atomic writers, this layer's own included) put
//! beside the real one for a moment: no watcher reacts to them.

use std::path::Path;

/// Files editors write beside the real one: swap files, backups, `4913`
/// (vim's probe), emacs lock files, and temporaries of atomic saves
/// (`*.tmp`, `*.tmp.*`, this layer's `.NAME.npc-PID-N.tmp`).
pub fn is_editor_noise(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return true;
    };
    name.ends_with('~')
        || name.ends_with(".swp")
        || name.ends_with(".swx")
        || name.ends_with(".swo")
        || name.ends_with(".tmp")
        || name.starts_with(".#")
        || name.starts_with('#')
        || name == "4913"
        || name.contains(".tmp.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn editor_noise_is_ignored() {
        for noise in [
            "a/.npcagent.toml.swp",
            "a/npcagent.toml~",
            "a/4913",
            "a/.#npcagent.toml",
            "a/x.tmp",
            "a/.npcagent.toml.npc-12-3.tmp",
        ] {
            assert!(is_editor_noise(Path::new(noise)), "{noise}");
        }
        assert!(!is_editor_noise(Path::new("a/npcagent.toml")));
    }
}
