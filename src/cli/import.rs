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
            errln!("error: {e}");
            return Ok(Exit::Failed);
        }
    };
    if !write {
        out!("{}", native::to_manifest_toml(&entries))?;
        return Ok(Exit::Ok);
    }
    let path = super::manifest_path(manifest)?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    let merged = match native::merge_into_manifest(&text, &entries) {
        Ok(m) => m,
        Err(e) => {
            errln!("error: {e}");
            return Ok(Exit::Failed);
        }
    };
    let tmp = path.with_extension("toml.npc-import");
    std::fs::write(&tmp, &merged).with_context(|| format!("cannot write `{}`", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot replace `{}`", path.display()))?;
    outln!(
        "merged {} MCP server(s) from {} into {}",
        entries.len(),
        file.display(),
        path.display()
    )?;
    outln!("next: run `npc validate`, then `npc plan`")?;
    Ok(Exit::Ok)
}
