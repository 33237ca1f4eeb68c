//! The command line: clap definitions and dispatch. Each command lives in
//! its own file and returns an [`Exit`]; only this edge prints errors with
//! anyhow/miette formatting and turns them into exit codes. All printing
//! goes through [`output`] (`out!`, `outln!`, `errln!`), never `println!`.

#![deny(clippy::print_stdout, clippy::print_stderr)]

#[macro_use]
mod output;

mod acp;
mod doctor;
mod hook;
mod human;
mod import;
mod init;
mod man;
mod mcp;
mod notify;
mod pane;
mod plugin;
mod reconcile;
mod render;
mod run;
mod triggers;
mod validate;
mod worker;
mod workflows;

use std::path::{Path, PathBuf};
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
    /// A policy or permission denial stopped what the agent tried (`npc
    /// run`: the run is `blocked`).
    Blocked = 3,
    /// The operation outlived its timeout (`npc run`).
    TimedOut = 124,
    /// Cancelled by SIGINT (Ctrl-C).
    Interrupted = 130,
    /// Cancelled by SIGTERM.
    Terminated = 143,
}

impl Exit {
    /// Every status, in order: the one table of exit codes every command
    /// follows (`npc(1)` and each page's EXIT STATUS, and the table of
    /// `docs/guide/commands.md`, which a test holds to it).
    pub const ALL: [Exit; 7] = [
        Exit::Ok,
        Exit::Failed,
        Exit::Usage,
        Exit::Blocked,
        Exit::TimedOut,
        Exit::Interrupted,
        Exit::Terminated,
    ];

    /// What the status means for any command (a command may give it a
    /// meaning of its own: see `man::DOCS`).
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => {
                "success: valid, applied, done, no changes; also a closed output pipe and `--help`"
            }
            Exit::Failed => {
                "invalid input (an invalid manifest or package) or a failed operation (no daemon, an unknown run, a store that does not answer)"
            }
            Exit::Usage => "a usage error (an unknown option, a bad argument), or an I/O error",
            Exit::Blocked => {
                "`npc run`: a policy or permission denial stopped what the agent tried (the run is `blocked`)"
            }
            Exit::TimedOut => "`npc run`: the run timed out (as `timeout(1)`)",
            Exit::Interrupted => "`npc run`: cancelled by SIGINT (Ctrl-C)",
            Exit::Terminated => "`npc run`: cancelled by SIGTERM",
        }
    }
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
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        path: Option<PathBuf>,
        /// The manifest file, as every other command takes it
        #[arg(long, short = 'm', conflicts_with = "path")]
        manifest: Option<PathBuf>,
        /// Report a `${VAR}` the environment does not set as a warning, not an error (CI without the secrets); its value is not checked. An MCP server's `env`, `headers`, `args` and `url` are warnings without it: npc needs them only to start that server
        #[arg(long)]
        allow_missing_env: bool,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Print the manifest's JSON Schema (or the REST API's OpenAPI document, or the events' schema)
    Schema {
        /// Print the daemon API's OpenAPI 3.1 document instead
        #[arg(long, conflicts_with = "events")]
        openapi: bool,
        /// Print the JSON Schema of every event kind instead (`kind` and `payload`)
        #[arg(long)]
        events: bool,
        /// With `--events`: print the Markdown reference of the events (`docs/events.md`)
        #[arg(long, requires = "events")]
        markdown: bool,
    },
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
    /// Check each declared agent CLI: installed, its version, its agent files, its trust of the repository
    Doctor(doctor::DoctorArgs),
    /// Serve the Agent Client Protocol on stdio: npc as an agent for editors (Zed, VS Code)
    Acp(acp::AcpArgs),
    /// Print shell completions
    Completions { shell: clap_complete::Shell },
    /// Write the man pages (npc(1), one per subcommand, npcagent.toml(5)), or list them
    Man {
        /// Directory to write `man1/` and `man5/` into (e.g. ~/.local/share/man)
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Read an agent CLI's MCP config, slash command or subagent and print (or merge) the manifest entries
    Import {
        /// `.mcp.json`, `.codex/config.toml`, `.gemini/settings.json` or `opencode.json`; or a command (`.claude/commands/NAME.md`, `.gemini/commands/NAME.toml`, `.opencode/commands/NAME.md`) or agent (`.claude/agents/NAME.md`, `.gemini/agents/NAME.md`, `.opencode/agents/NAME.md`, `.codex/agents/NAME.toml`)
        file: PathBuf,
        /// Merge into the manifest instead of printing; entries the manifest already declares identically are left as they are
        #[arg(long)]
        write: bool,
        /// With `--write`: replace the manifest's entries that differ from the imported ones of the same name (without it, they are shown as a diff and nothing is written)
        #[arg(long, requires = "write")]
        replace: bool,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
    /// Show what `npc apply` would change, compared with the running daemon or the last apply
    Plan {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
        /// Exit 2 when there are changes or conflicts in agent files (0 none, 1 error)
        #[arg(long)]
        detailed_exitcode: bool,
        /// Plan the user-level agent config files (`~/.claude.json`, `~/.codex/config.toml`, …) instead of the repository's
        #[arg(long)]
        user: bool,
        /// Plan replacing agent-file entries npc did not write that have a manifest server's name (they are conflicts otherwise)
        #[arg(long)]
        force_agent_files: bool,
        /// Also save the plan to FILE: `npc apply FILE` applies exactly it, and refuses when anything it was computed from changed
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Apply the plan: through the running daemon, or record it when none runs
    Apply {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Apply without asking
        #[arg(long)]
        auto_approve: bool,
        /// Write the user-level agent config files (`~/.claude.json`, `~/.codex/config.toml`, …) instead of the repository's
        #[arg(long)]
        user: bool,
        /// Replace agent-file entries npc did not write that have a manifest server's name; from then on npc manages them
        #[arg(long)]
        force_agent_files: bool,
        /// A plan saved by `npc plan --out FILE`: apply exactly it, without asking (its `--user` and `--force-agent-files` apply); refused when anything it was computed from changed
        #[arg(value_name = "FILE", conflicts_with_all = ["auto_approve", "user", "force_agent_files"])]
        plan: Option<PathBuf>,
    },
    /// Run the reconciler: apply the manifest and hot-reload it on every change
    Daemon {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
    /// The MCP gateway: the repository's MCP servers behind one MCP server
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// Agent Plugins 1.0 packages: validate, test, scaffold, register
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Lifecycle hooks: run the manifest's hooks for an agent CLI's own hook mechanism
    #[command(subcommand)]
    Hook(hook::HookCommand),
    /// Panes: agent CLIs in terminals the daemon hosts
    #[command(subcommand)]
    Pane(pane::PaneCommand),
    /// Notification sinks (`[notify.NAME]`): `npc notify test NAME` sends a sample
    #[command(subcommand)]
    Notify(notify::NotifyCommand),
    /// Each component: state, pid, restarts, since when
    Status {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Print the URL of the dashboard the running daemon serves
    Dashboard {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
    /// The durable event log
    Events {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Only events after this id
        #[arg(long)]
        since: Option<i64>,
        /// Only the last N events (with `--follow`, then every new one)
        #[arg(long, value_name = "N", conflicts_with = "fleet")]
        limit: Option<usize>,
        /// Keep printing new events
        #[arg(long)]
        follow: bool,
        /// The fleet's shared event log from the store `[store] url` names
        /// (every worker's and daemon's events, in the store's order)
        #[arg(long)]
        fleet: bool,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Triggers: next fire times, routes, watched paths and recent runs
    Triggers {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Act on one trigger (`npc trigger fire NAME`)
    #[command(subcommand)]
    Trigger(triggers::TriggerCommand),
    /// Runs of triggers and of `npc run`; `npc runs show ID` prints one run's events
    Runs(triggers::RunsArgs),
    /// Workflows: the declared ones and their latest runs
    Workflows {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Act on workflows: `npc workflow run NAME`, `show ID`, `cancel ID`
    #[command(subcommand)]
    Workflow(workflows::WorkflowCommand),
    /// Join the fleet of this repository on the store `[store] url` names and carry out the runs it claims there
    Worker(worker::WorkerArgs),
    /// The fleet's workers: host, version, heartbeat age, current runs; lost when a heartbeat is late
    Workers {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// The PostgreSQL store a fleet shares (`npc store migrate`)
    #[command(subcommand)]
    Store(worker::StoreCommand),
    /// Internal: the watchdog a daemon or `npc run` starts so that its
    /// children's process trees die with it (see `supervisor::Containment`)
    #[command(name = crate::supervisor::WATCHDOG_COMMAND, hide = true)]
    Watchdog {
        /// The repository the ledger is confined to
        #[arg(long)]
        root: PathBuf,
        /// The ledger file to remove once every recorded group is stopped
        #[arg(long)]
        ledger: PathBuf,
    },
}

/// Run the command line and return the process exit code.
pub fn main() -> ExitCode {
    // Before anything else: the stub must stay single-threaded.
    if let Some(code) = crate::supervisor::stub_main(&std::env::args_os().collect::<Vec<_>>()) {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Ok
            };
            // `--help` and `--version` print to stdout: a failure there is
            // handled like any other output failure.
            return match e.print() {
                Err(io) if code == Exit::Ok => end_on_output_error(&output::OutputError::from(io)),
                _ => code.into(),
            };
        }
    };
    match run(cli) {
        Ok(exit) => exit.into(),
        Err(e) => match output::classify(&e) {
            Some(out) => end_on_output_error(out),
            None => {
                errln!("error: {e:#}");
                Exit::Usage.into()
            }
        },
    }
}

/// The exit for a failed write to stdout: quiet success when the reader
/// closed the pipe, a message and [`Exit::Failed`] otherwise.
fn end_on_output_error(e: &output::OutputError) -> ExitCode {
    match e {
        output::OutputError::Closed => Exit::Ok.into(),
        output::OutputError::Failed { .. } => {
            errln!("error: {e}");
            Exit::Failed.into()
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<Exit> {
    // The commands that open the repository's state say what its guarded
    // layer did there (a state directory npc did not make, moved aside).
    if matches!(
        cli.command,
        Command::Plan { .. }
            | Command::Apply { .. }
            | Command::Status { .. }
            | Command::Events { .. }
            | Command::Runs(_)
            | Command::Workflows { .. }
            | Command::Workflow(_)
            | Command::Triggers { .. }
    ) {
        log_to_stderr("warn");
    }
    match cli.command {
        Command::Validate {
            path,
            manifest,
            allow_missing_env,
            format,
        } => validate::run(
            path.or(manifest),
            validate::Env { allow_missing_env },
            format,
        ),
        Command::Schema {
            events: true,
            markdown,
            ..
        } => {
            if markdown {
                out!("{}", crate::event::markdown())?;
            } else {
                outln!("{}", events_schema_text())?;
            }
            Ok(Exit::Ok)
        }
        Command::Schema { openapi: false, .. } => {
            outln!("{}", schema_text())?;
            Ok(Exit::Ok)
        }
        Command::Schema { openapi: true, .. } => {
            outln!("{}", crate::api::openapi::DOCUMENT_TEXT.trim_end())?;
            Ok(Exit::Ok)
        }
        Command::Init { dir } => init::run(&dir),
        Command::Plan {
            manifest,
            format,
            detailed_exitcode,
            user,
            force_agent_files,
            out,
        } => reconcile::plan(
            manifest,
            format,
            detailed_exitcode,
            reconcile::FileOptions {
                user,
                force_agent_files,
            },
            out,
        ),
        Command::Apply {
            manifest,
            auto_approve,
            user,
            force_agent_files,
            plan,
        } => reconcile::apply(
            manifest,
            auto_approve,
            reconcile::FileOptions {
                user,
                force_agent_files,
            },
            plan,
        ),
        Command::Daemon { manifest } => reconcile::daemon(manifest),
        Command::Status { manifest, format } => reconcile::status(manifest, format),
        Command::Dashboard { manifest } => reconcile::dashboard(manifest),
        Command::Events {
            manifest,
            since,
            follow,
            fleet: true,
            format,
            ..
        } => worker::fleet_events(manifest, since, follow, format),
        Command::Events {
            manifest,
            since,
            limit,
            follow,
            fleet: false,
            format,
        } => reconcile::events(manifest, since, limit, follow, format),
        Command::Triggers { manifest, format } => triggers::list(manifest, format),
        Command::Trigger(command) => triggers::trigger(command),
        Command::Runs(args) => triggers::runs(args),
        Command::Workflows { manifest, format } => workflows::list(manifest, format),
        Command::Workflow(command) => workflows::workflow(command),
        Command::Worker(args) => worker::worker(args),
        Command::Store(command) => worker::store(command),
        Command::Workers { manifest, format } => worker::workers(manifest, format),
        Command::Render(args) => render::run(args),
        Command::Run(args) => run::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Acp(args) => acp::run(args),
        Command::Mcp(command) => mcp::run(command),
        Command::Plugin(command) => plugin::run(command),
        Command::Hook(command) => hook::run(command),
        Command::Pane(command) => pane::run(command),
        Command::Notify(command) => notify::run(command),
        Command::Import {
            file,
            write,
            replace,
            manifest,
        } => import::run(&file, write, replace, manifest),
        Command::Watchdog { root, ledger } => {
            crate::supervisor::run_watchdog(std::io::stdin().lock(), &root, &ledger);
            Ok(Exit::Ok)
        }
        Command::Man { out } => man::run(out.as_deref()),
        Command::Completions { shell } => {
            // Generated into memory: clap_complete panics on a failed write.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "npc", &mut script);
            output::write_stdout_bytes(&script)?;
            Ok(Exit::Ok)
        }
    }
}

/// The events' JSON Schema as pretty-printed text (what `npc schema
/// --events` prints): `schemas/events.schema.json`, as built in.
pub fn events_schema_text() -> String {
    crate::event::SCHEMA_TEXT.trim_end().to_string()
}

/// The manifest's JSON Schema as pretty-printed text (what `npc schema`
/// prints and `npc init` writes): `schemas/npcagent.schema.json`, as built in.
pub fn schema_text() -> String {
    crate::model::SCHEMA_TEXT.trim_end().to_string()
}

/// Send logs to stderr, filtered by `NPC_LOG` (else `RUST_LOG`, else npc's
/// own lines at `level` and every library's at `warn` only: a library's
/// debug structs never flood the terminal by default). Colour only when
/// stderr is a terminal, so a log file holds no escape codes. A failed
/// write to stderr (a full disk, a gone reader) loses the line and nothing
/// else: tracing's own report of it would `eprint!` and panic.
fn log_to_stderr(level: &str) {
    use std::io::IsTerminal as _;
    let filter = std::env::var("NPC_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default_log_filter(level));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .log_internal_errors(false)
        .try_init();
}

/// The log filter when none is set: npc's own lines at `level`, every
/// library's at `warn`.
fn default_log_filter(level: &str) -> String {
    format!("warn,{}={level}", env!("CARGO_CRATE_NAME"))
}

/// What a command that records events and starts processes without a
/// daemon (`npc run`, `npc mcp serve`) works with: the event bus over the
/// repository's store (the manifest's secrets scrubbed), a supervisor that
/// contains every process group it starts, and the receiver of that
/// supervisor's events (keep it alive). Call inside a tokio runtime.
fn standalone_recording(
    paths: &crate::runtime::RepoPaths,
    manifest: &crate::model::Manifest,
) -> anyhow::Result<(
    crate::bus::EventBus,
    crate::supervisor::Supervisor,
    tokio::sync::mpsc::UnboundedReceiver<crate::supervisor::SupervisorEvent>,
)> {
    use anyhow::Context as _;
    let store = std::sync::Arc::new(
        crate::runtime::open_store(paths)
            .with_context(|| format!("cannot open `{}`", paths.db().display()))?,
    );
    let bus = crate::bus::EventBus::new(store);
    bus.set_secrets(manifest.secret_values());
    let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
    let supervisor = crate::supervisor::Supervisor::for_npc(
        events,
        crate::supervisor::BackoffPolicy::default(),
        &paths.root,
        &paths.runtime_dir(),
    );
    Ok((bus, supervisor, receiver))
}

/// Load the manifest at `path` (with the process environment) for a
/// command that needs a valid one. When it is invalid, every diagnostic is
/// printed with "fix it (see `npc validate`) `before`" and `None` returned
/// (the command exits [`Exit::Failed`]).
fn valid_manifest(
    path: &std::path::Path,
    before: &str,
) -> anyhow::Result<Option<crate::model::Manifest>> {
    use anyhow::Context as _;
    let loaded = crate::runtime::load_from_disk(path)
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    if loaded.manifest.is_none() {
        for d in &loaded.diagnostics {
            errln!("{d}");
        }
        errln!(
            "error: `{}` is invalid; fix it (see `npc validate`) {before}",
            loaded.source.name()
        );
    }
    Ok(loaded.manifest)
}

fn manifest_path(path: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = path {
        return Ok(p);
    }
    if let Some(p) = std::env::var_os(MANIFEST_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    find_manifest(&cwd).ok_or_else(|| {
        anyhow::anyhow!(
            "no `npcagent.toml` or `npcagent.json` in {} or a directory above it (up to the repository's root); run `npc init` to create one, pass `-m PATH`, or set `{MANIFEST_ENV}`",
            cwd.display()
        )
    })
}

/// The variable naming the manifest when no `-m` is given.
pub const MANIFEST_ENV: &str = "NPC_MANIFEST";

/// The manifest for a command run in `cwd`: the first directory from `cwd`
/// upward that holds `npcagent.toml` (else `npcagent.json`), the search
/// ending at the repository's root (the first directory with `.git`), so a
/// command in a subdirectory finds its repository's manifest and never one
/// of a directory that holds the repository. The path is relative to `cwd`
/// (`npcagent.toml`, `../npcagent.toml`), so diagnostics name it briefly.
fn find_manifest(cwd: &Path) -> Option<PathBuf> {
    let mut up = PathBuf::new();
    for dir in cwd.ancestors() {
        for name in crate::model::MANIFEST_NAMES {
            if dir.join(name).is_file() {
                return Some(up.join(name));
            }
        }
        if dir.join(".git").exists() {
            return None;
        }
        up.push("..");
    }
    None
}
