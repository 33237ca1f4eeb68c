//! The command line: clap definitions and dispatch. Each command lives in
//! its own file and returns an [`Exit`]; only this edge prints errors with
//! anyhow/miette formatting and turns them into exit codes.

mod import;
mod init;
mod mcp;
mod reconcile;
mod render;
mod run;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

/// Exit statuses shared by the commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Success (valid, no changes, done).
    Ok = 0,
    /// Invalid input or a failed operation.
    Failed = 1,
    /// Usage or I/O error (or, with `--detailed-exitcode`, changes present).
    Usage = 2,
    /// The operation outlived its timeout (`npc run`).
    TimedOut = 124,
    /// Cancelled by SIGINT (Ctrl-C).
    Interrupted = 130,
    /// Cancelled by SIGTERM.
    Terminated = 143,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// Output format of commands that have a machine-readable form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Format {
    #[default]
    Human,
    Json,
}

#[derive(Debug, Parser)]
#[command(
    name = "npc",
    version,
    about = "One validated manifest for every CLI coding agent in a repository",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a manifest: every problem at once, with file:line:column
    Validate {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory)
        path: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Print the manifest's JSON Schema
    Schema,
    /// Write a commented starter npcagent.toml (never overwrites)
    Init {
        /// Directory to write into
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Render an agent profile or a prompt to stdout
    Render(render::RenderArgs),
    /// Run an agent profile headless, stream its events and record them
    Run(run::RunArgs),
    /// Print shell completions
    Completions { shell: clap_complete::Shell },
    /// Read an agent CLI's MCP config and print (or merge) the manifest entries
    Import {
        /// `.mcp.json`, `.codex/config.toml`, `.gemini/settings.json` or `opencode.json`
        file: PathBuf,
        /// Merge into the manifest instead of printing
        #[arg(long)]
        write: bool,
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
    /// Show what `npc apply` would change, compared with the running daemon or the last apply
    Plan {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
        /// Exit 2 when there are changes (0 none, 1 error)
        #[arg(long)]
        detailed_exitcode: bool,
        /// Plan the user-level agent config files (`~/.claude.json`, `~/.codex/config.toml`, …) instead of the repository's
        #[arg(long)]
        user: bool,
    },
    /// Apply the plan: through the running daemon, or record it when none runs
    Apply {
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Apply without asking
        #[arg(long)]
        auto_approve: bool,
        /// Write the user-level agent config files (`~/.claude.json`, `~/.codex/config.toml`, …) instead of the repository's
        #[arg(long)]
        user: bool,
    },
    /// Run the reconciler: apply the manifest and hot-reload it on every change
    Daemon {
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
    /// The MCP gateway: the repository's MCP servers behind one MCP server
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// Each component: state, pid, restarts, since when
    Status {
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// The durable event log
    Events {
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Only events after this id
        #[arg(long)]
        since: Option<i64>,
        /// Keep printing new events
        #[arg(long)]
        follow: bool,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
}

/// Run the command line and return the process exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Ok
            };
            let _ = e.print();
            return code.into();
        }
    };
    match run(cli) {
        Ok(exit) => exit.into(),
        Err(e) => {
            eprintln!("error: {e:#}");
            Exit::Usage.into()
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Validate { path, format } => validate::run(path, format),
        Command::Schema => {
            println!("{}", schema_text());
            Ok(Exit::Ok)
        }
        Command::Init { dir } => init::run(&dir),
        Command::Plan {
            manifest,
            format,
            detailed_exitcode,
            user,
        } => reconcile::plan(manifest, format, detailed_exitcode, user),
        Command::Apply {
            manifest,
            auto_approve,
            user,
        } => reconcile::apply(manifest, auto_approve, user),
        Command::Daemon { manifest } => reconcile::daemon(manifest),
        Command::Status { manifest, format } => reconcile::status(manifest, format),
        Command::Events {
            manifest,
            since,
            follow,
            format,
        } => reconcile::events(manifest, since, follow, format),
        Command::Render(args) => render::run(args),
        Command::Run(args) => run::run(args),
        Command::Mcp(command) => mcp::run(command),
        Command::Import {
            file,
            write,
            manifest,
        } => import::run(&file, write, manifest),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "npc", &mut std::io::stdout());
            Ok(Exit::Ok)
        }
    }
}

/// The JSON Schema as pretty-printed text (what `npc schema` prints and
/// `schemas/npcagent.schema.json` holds).
pub fn schema_text() -> String {
    serde_json::to_string_pretty(&crate::model::json_schema()).unwrap_or_default()
}

/// The manifest to use: `path`, or the one in the current directory
/// (named relative to it, so diagnostics read `npcagent.toml:3:1`).
fn manifest_path(path: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = path {
        return Ok(p);
    }
    crate::model::MANIFEST_NAMES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            let cwd = std::env::current_dir().unwrap_or_default();
            anyhow::anyhow!(
                "no `npcagent.toml` or `npcagent.json` in {}; run `npc init` to create one, or pass a path",
                cwd.display()
            )
        })
}
