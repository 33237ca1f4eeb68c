//! `npc import FILE [--write] [--replace]`: read an agent CLI's native MCP
//! config (Claude `.mcp.json`, Codex `config.toml`, Gemini `settings.json`,
//! OpenCode `opencode.json`), slash command or subagent file (see
//! `native::import_config`) and print the equivalent manifest entries, or
//! merge them into the manifest keeping its comments. Importing a file npc
//! keeps in step works: entries the manifest already declares identically
//! are left as they are, differing ones are shown as a diff and taken only
//! with `--replace`, and every imported entry becomes managed in the file it
//! came from, so the next manifest edit reaches it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::Exit;
use crate::native::{self, MergeOptions, Target};
use crate::runtime::{self, RepoPaths};
use crate::stdx::term::printable;

pub fn run(
    file: &Path,
    write: bool,
    replace: bool,
    manifest: Option<PathBuf>,
) -> anyhow::Result<Exit> {
    if let Some(recognised) = native::import_config::recognise(file) {
        return run_config(file, recognised, write, replace, manifest);
    }
    let (kind, entries) = match native::import(file) {
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
    // The manifest through the guarded layer rooted at its directory: read
    // bounded, replaced atomically (a link inside the directory is written
    // through; one leaving it is refused).
    let dir = path.parent().unwrap_or(Path::new(""));
    let guard = crate::repofs::Root::new(dir)?;
    let name = path.file_name().map(Path::new).unwrap_or(&path);
    let text = guard
        .read_string(name, crate::model::node::MAX_MANIFEST_BYTES)
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    // The manifest as it stands (when valid) decides which entries npc
    // already keeps in step; an invalid one is compared by its text only.
    let model = runtime::load_manifest(&path)
        .ok()
        .and_then(|loaded| loaded.manifest);
    let same = |name: &str, server: &native::ImportedServer| {
        model
            .as_ref()
            .and_then(|m| m.mcp_servers.get(name))
            .is_some_and(|ours| native::same_as_manifest(kind, name, ours, server))
    };
    let merged = match native::merge_into_manifest(&text, &entries, same, MergeOptions { replace })
    {
        Ok(m) => m,
        Err(e) => {
            errln!("error: {e}");
            return Ok(Exit::Failed);
        }
    };
    if merged.text != text {
        guard
            .write(
                name,
                merged.text.as_bytes(),
                crate::repofs::WriteOptions::SHARED,
            )
            .with_context(|| format!("cannot replace `{}`", path.display()))?;
    }
    let list = |names: &[String]| {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    outln!(
        "merged {} MCP server(s) from {} into {}",
        merged.added.len() + merged.replaced.len(),
        file.display(),
        path.display()
    )?;
    if !merged.unchanged.is_empty() {
        outln!(
            "already in the manifest, unchanged: {}",
            printable(&list(&merged.unchanged))
        )?;
    }
    if !merged.replaced.is_empty() {
        outln!("replaced: {}", printable(&list(&merged.replaced)))?;
    }
    let names: BTreeSet<String> = entries.into_iter().map(|(n, _)| n).collect();
    adopt(&path, file, kind, names)?;
    // npc writes a CLI's file only for a provider of that CLI: say so
    // rather than promise a file npc will never write.
    let declared = runtime::load_from_disk(&path)
        .ok()
        .and_then(|loaded| loaded.manifest)
        .is_none_or(|m| m.providers.values().any(|p| p.kind == kind));
    if !declared {
        outln!(
            "note: the manifest declares no provider of kind `{k}`, so npc does not write `{}`; add `[providers.{k}]` with `kind = \"{k}\"` to have it kept in step",
            printable(&file.display().to_string()),
            k = kind.as_str()
        )?;
    }
    outln!("next: run `npc validate`, then `npc plan`")?;
    Ok(Exit::Ok)
}

/// `npc import` of a slash command or a subagent (see
/// `native::import_config`): print its manifest tables, or merge them.
fn run_config(
    file: &Path,
    (kind, what, name): (
        native::ProviderKind,
        native::import_config::ConfigKind,
        String,
    ),
    write: bool,
    replace: bool,
    manifest: Option<PathBuf>,
) -> anyhow::Result<Exit> {
    let text = match native::read_existing(file) {
        Ok(Some(text)) => text,
        Ok(None) => {
            errln!(
                "error: `{}` does not exist; check the path",
                printable(&file.display().to_string())
            );
            return Ok(Exit::Failed);
        }
        Err(e) => {
            errln!("error: {e}");
            return Ok(Exit::Failed);
        }
    };
    let path = super::manifest_path(manifest);
    let model = path
        .as_ref()
        .ok()
        .and_then(|p| runtime::load_manifest(p).ok())
        .and_then(|loaded| loaded.manifest);
    let imported = match native::import_config::import_config(
        file,
        &text,
        (kind, what, &name),
        model.as_ref(),
    ) {
        Ok(i) => i,
        Err(e) => {
            errln!("error: {e}");
            return Ok(Exit::Failed);
        }
    };
    for note in &imported.notes {
        errln!("note: {}", printable(note));
    }
    if !write {
        out!("{}", imported.to_toml())?;
        return Ok(Exit::Ok);
    }
    let path = path?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let guard = crate::repofs::Root::new(dir)?;
    let manifest_name = path.file_name().map(Path::new).unwrap_or(&path);
    let before = guard
        .read_string(manifest_name, crate::model::node::MAX_MANIFEST_BYTES)
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    let (after, changed) = match native::import_config::merge_config(&before, &imported, replace) {
        Ok(m) => m,
        Err(e) => {
            errln!("error: {e}");
            return Ok(Exit::Failed);
        }
    };
    if after != before {
        guard
            .write(
                manifest_name,
                after.as_bytes(),
                crate::repofs::WriteOptions::SHARED,
            )
            .with_context(|| format!("cannot replace `{}`", path.display()))?;
    }
    let list = changed
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if changed.is_empty() {
        outln!("already in the manifest, unchanged")?;
    } else {
        outln!(
            "merged {} from {} into {}",
            printable(&list),
            printable(&file.display().to_string()),
            path.display()
        )?;
    }
    outln!(
        "npc leaves `{}` alone while it is yours: delete it and run `npc apply` to have npc write it from the manifest",
        printable(&file.display().to_string())
    )?;
    outln!("next: run `npc validate`, then `npc plan`")?;
    Ok(Exit::Ok)
}

/// When `file` is the repository's own agent file of `kind`, record the
/// imported names as entries npc manages there.
fn adopt(
    manifest: &Path,
    file: &Path,
    kind: native::ProviderKind,
    names: BTreeSet<String>,
) -> anyhow::Result<()> {
    let paths = RepoPaths::resolve(manifest, &runtime::state_dir_hint(manifest))?;
    let target = native::target_path(&paths.root, &Target::project(kind));
    let same_file = match (file.canonicalize(), target.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same_file || names.is_empty() {
        return Ok(());
    }
    let key = target
        .strip_prefix(&paths.root)
        .unwrap_or(&target)
        .display()
        .to_string();
    let store = runtime::open_store(&paths)?;
    let mut managed = store.managed_entries(&key)?;
    managed.extend(names.iter().cloned());
    // The lock too, so a clone of the repository knows them as npc's.
    let mut lock = native::ownership::read(&paths.root).unwrap_or_default();
    let mut locked = lock.entries(&key);
    locked.extend(names);
    lock.set(&key, locked);
    native::ownership::write(&paths.root, &lock)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        store.set_managed_entries(key.clone(), managed).await?;
        store.flush().await
    })?;
    outln!("npc now keeps these entries of {key} in step with the manifest")?;
    Ok(())
}
