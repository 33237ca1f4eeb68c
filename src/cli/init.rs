//! `npc init`: write a commented starter manifest that validates, plus the
//! JSON Schema it names in its `#:schema` line so editors complete it.

use std::path::Path;

use anyhow::Context as _;

use super::Exit;
use crate::native;
use crate::stdx::term::printable;

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
    // `dir` is the user's choice; everything in it goes through the
    // guarded layer: the state directory private and git-ignored, the
    // manifest created only where nothing (not even a link) is.
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
    let guard = crate::repofs::Root::new(dir)?;
    let schema = dir.join(SCHEMA_FILE);
    if let Some(parent) = Path::new(SCHEMA_FILE).parent() {
        guard.ensure_state_dir(parent)?;
    }
    guard.write(
        Path::new(SCHEMA_FILE),
        (super::schema_text() + "\n").as_bytes(),
        crate::repofs::WriteOptions::PRIVATE,
    )?;
    let manifest = dir.join(crate::model::MANIFEST_NAMES[0]);
    guard
        .create_new(
            Path::new(crate::model::MANIFEST_NAMES[0]),
            STARTER.as_bytes(),
            crate::repofs::Perms::Shared,
        )
        .with_context(|| format!("cannot create `{}`", manifest.display()))?;
    outln!(
        "wrote {} (schema for editors: {})",
        manifest.display(),
        schema.display()
    )?;
    outln!("next: edit it, then run `npc validate`")?;
    // Agent configs already here: their MCP servers can come along.
    let found: Vec<String> = crate::model::ProviderKind::ALL
        .into_iter()
        .map(|kind| native::target_path(dir, &native::Target::project(kind)))
        // Through the guarded layer: a file here (or a link to one here),
        // never one a link leads to outside the repository.
        .filter(|path| native::read_existing_in(dir, path).is_ok_and(|text| text.is_some()))
        .map(|path| {
            path.strip_prefix(dir)
                .unwrap_or(&path)
                .display()
                .to_string()
        })
        .collect();
    for file in &found {
        outln!(
            "found {}: bring its MCP servers into the manifest with `npc import {} --write`",
            printable(file),
            printable(file)
        )?;
    }
    Ok(Exit::Ok)
}
