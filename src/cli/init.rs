//! `npc init`: write a commented starter manifest that validates, plus the
//! JSON Schema it names in its `#:schema` line so editors complete it.

use std::path::Path;

use anyhow::Context as _;

use super::Exit;

/// The starter manifest `npc init` writes.
pub const STARTER: &str = include_str!("starter.toml");
/// Where the schema for editors is written, relative to the manifest.
pub const SCHEMA_FILE: &str = ".npc/npcagent.schema.json";

pub fn run(dir: &Path) -> anyhow::Result<Exit> {
    for name in crate::model::MANIFEST_NAMES {
        let existing = dir.join(name);
        if existing.exists() {
            errln!(
                "error: `{}` already exists; npc init never overwrites a manifest",
                existing.display()
            );
            errln!("  = help: edit it, or run `npc validate` to check it");
            return Ok(Exit::Usage);
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
    let schema = dir.join(SCHEMA_FILE);
    if let Some(parent) = schema.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create `{}`", parent.display()))?;
    }
    std::fs::write(&schema, super::schema_text() + "\n")
        .with_context(|| format!("cannot write `{}`", schema.display()))?;
    let manifest = dir.join(crate::model::MANIFEST_NAMES[0]);
    // create_new: never clobber a file that appeared in the meantime.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&manifest)
        .with_context(|| format!("cannot create `{}`", manifest.display()))?;
    std::io::Write::write_all(&mut file, STARTER.as_bytes())?;
    outln!(
        "wrote {} (schema for editors: {})",
        manifest.display(),
        schema.display()
    )?;
    outln!("next: edit it, then run `npc validate`")?;
    Ok(Exit::Ok)
}
