//! `npc import FILE [--write]`: read an agent CLI's native MCP config
//! (Claude `.mcp.json`, Codex `config.toml`, Gemini `settings.json`,
//! OpenCode `opencode.json`) and print the equivalent manifest entries, or
//! merge them into the manifest keeping its comments.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::Exit;
use crate::native;

pub fn run(file: &Path, write: bool, manifest: Option<PathBuf>) -> anyhow::Result<Exit> {
    let entries = match native::import(file) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Failed);
        }
    };
    if !write {
        print!("{}", native::to_manifest_toml(&entries));
        return Ok(Exit::Ok);
    }
    let path = super::manifest_path(manifest)?;
    // The manifest through the guarded layer rooted at its directory: read
    // bounded, replaced atomically (a link inside the directory is written
    // through; one leaving it is refused).
    let dir = path.parent().unwrap_or(Path::new(""));
    let guard = crate::repofs::Root::new(dir)?;
    let name = path.file_name().map(Path::new).unwrap_or(&path);
    let text = guard
        .read_string(name, crate::model::node::MAX_MANIFEST_BYTES)
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    let merged = match native::merge_into_manifest(&text, &entries) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Failed);
        }
    };
    guard
        .write(name, merged.as_bytes(), crate::repofs::WriteOptions::SHARED)
        .with_context(|| format!("cannot replace `{}`", path.display()))?;
    println!(
        "merged {} MCP server(s) from {} into {}",
        entries.len(),
        file.display(),
        path.display()
    );
    println!("next: run `npc validate`, then `npc plan`");
    Ok(Exit::Ok)
}
