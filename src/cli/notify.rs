//! `npc notify test NAME`: send a `[notify.NAME]` sink a sample message
//! (a failed run of a GitHub issue, or the sink's first `on` name), once,
//! without a daemon, and say what happened: exit 0 when the sink took it,
//! 1 when it did not (the error names why).

use std::path::PathBuf;

use clap::Subcommand;

use super::Exit;
use crate::runtime::{self, RepoPaths};
use crate::stdx::term::printable;

#[derive(Debug, Subcommand)]
pub enum NotifyCommand {
    /// Send a notification sink a sample message, once, and print what happened
    Test {
        /// The sink (a `[notify.NAME]` entry)
        name: String,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
}

pub fn run(command: NotifyCommand) -> anyhow::Result<Exit> {
    let NotifyCommand::Test { name, manifest } = command;
    let path = super::manifest_path(manifest)?;
    let paths = RepoPaths::resolve(&path, &runtime::state_dir_hint(&path))?;
    let Some(manifest) = super::valid_manifest(&paths.manifest, "before testing a sink")? else {
        return Ok(Exit::Failed);
    };
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (events, _receiver) = tokio::sync::mpsc::unbounded_channel();
    let kind = manifest.notify.get(&name).map(|s| s.sink.kind());
    let sent = tokio.block_on(async {
        let supervisor =
            crate::supervisor::Supervisor::new(events, crate::supervisor::BackoffPolicy::default());
        crate::notify::send_sample(&manifest, &name, supervisor, paths.root.clone()).await
    });
    match sent {
        Ok(done) => {
            let status = done
                .status
                .map_or_else(String::new, |s| format!(": HTTP {s}"));
            outln!(
                "sent a sample to `{}` ({}){status} in {} ms",
                printable(&name),
                kind.unwrap_or_default(),
                done.duration.as_millis()
            )?;
            Ok(Exit::Ok)
        }
        Err(e) => {
            errln!(
                "error: the sample to `{}` was not delivered: {}",
                printable(&name),
                printable(&e.to_string())
            );
            Ok(Exit::Failed)
        }
    }
}
