//! `npc render profile NAME` / `npc render prompt NAME [--var k=v]`: load
//! the manifest and print a rendered agent profile or prompt (or, with
//! `--write`, write a profile where `npc apply` keeps rendered profiles).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use super::Exit;

use crate::render::{self, RenderContext};

#[derive(Debug, Args)]
pub struct RenderArgs {
    #[command(subcommand)]
    target: Target,
    /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
    #[arg(long, short = 'm', global = true)]
    manifest: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Target {
    /// Render an agent profile: Markdown with YAML frontmatter
    Profile {
        /// Profile name (a `[profiles.NAME]` entry)
        name: String,
        /// Write it under the state directory (`profiles/NAME.md`) instead of printing it
        #[arg(long)]
        write: bool,
    },
    /// Render a prompt template
    Prompt {
        /// Prompt name (a `[prompts.NAME]` entry)
        name: String,
        /// Set a declared variable (repeatable)
        #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
        vars: Vec<(String, String)>,
        /// Render for this profile (fills `profile` in the template)
        #[arg(long)]
        profile: Option<String>,
        /// A trigger payload as JSON (fills `trigger` in the template)
        #[arg(long, value_name = "JSON", value_parser = parse_json)]
        trigger: Option<serde_json::Value>,
    },
}

fn parse_var(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected NAME=VALUE, got `{s}`")),
    }
}

/// The state directory of `manifest` in the repository at `root`.
fn ctx_state_dir(root: &std::path::Path, manifest: &crate::model::Manifest) -> PathBuf {
    root.join(&manifest.project.state_dir)
}

fn parse_json(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))
}

pub fn run(args: RenderArgs) -> anyhow::Result<Exit> {
    let path = super::manifest_path(args.manifest)?;
    // The repository is the manifest's directory (a manifest that is a
    // link never moves it elsewhere).
    let path = crate::runtime::RepoPaths::resolve(&path, crate::model::DEFAULT_STATE_DIR)
        .with_context(|| format!("cannot read `{}`", path.display()))?
        .manifest;
    let Some(manifest) = super::valid_manifest(&path, "before rendering")? else {
        return Ok(Exit::Failed);
    };
    let manifest = &manifest;
    let root = path.parent().map(PathBuf::from).unwrap_or_default();
    let ctx = RenderContext::new(&root, manifest);
    let result = match args.target {
        Target::Profile { name, write } => render::profile(manifest, &name, &ctx).map(|text| {
            let file = write.then(|| render::profile_path(ctx.state_dir(), &name));
            (file, text)
        }),
        Target::Prompt {
            name,
            vars,
            profile,
            trigger,
        } => {
            let mut given = BTreeMap::new();
            for (k, v) in vars {
                if given.insert(k.clone(), v).is_some() {
                    anyhow::bail!("`--var {k}` is given twice; give each variable once");
                }
            }
            let mut ctx = ctx;
            if let Some(p) = profile {
                ctx = ctx.with_profile(p);
            }
            if let Some(t) = trigger {
                ctx = ctx.with_trigger(t);
            }
            render::prompt(manifest, &name, &given, &ctx).map(|text| (None, text))
        }
    };
    match result {
        Ok((None, text)) => {
            out!("{text}")?;
            Ok(Exit::Ok)
        }
        Ok((Some(file), text)) => {
            // npc's own file: private, never through a link, in a state
            // directory that git ignores.
            let guard = crate::repofs::Root::new(&root)?;
            guard.ensure_state_dir(ctx_state_dir(&root, manifest).as_path())?;
            guard.write(&file, text.as_bytes(), crate::repofs::WriteOptions::PRIVATE)?;
            outln!("wrote {}", file.display())?;
            Ok(Exit::Ok)
        }
        Err(e) => {
            errln!("error: {e}");
            Ok(Exit::Failed)
        }
    }
}
