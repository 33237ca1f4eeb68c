//! `npc plan`, `npc apply`, `npc daemon`, `npc status` and `npc events`:
//! the reconciler's commands. Each talks to the running daemon through the
//! control channel when one runs, and to the store otherwise.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use super::output::OutputError;
use super::{Exit, Format};
use crate::model::Manifest;
use crate::plan::{self, Action, ObservedState, Plan, Standing};
use crate::runtime::files::{self, FilePlan};
use crate::runtime::{self, RepoPaths};
use crate::stdx::term::printable;
use crate::store::Store;
use crate::surfaces::control::{self, Client, Reply, Request};

/// How long the daemon's runtime gets to end its tasks once the daemon has
/// stopped (its components are stopped already).
const DAEMON_RUNTIME_SHUTDOWN: Duration = Duration::from_secs(5);

/// How long `npc events` without a daemon waits between looks at the store
/// while following (the daemon pushes events; the store can only be read).
pub const STORE_FOLLOW_WAIT: Duration = Duration::from_secs(1);

pub(super) fn tokio() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// A valid manifest, where its repository keeps state, and what it was
/// loaded from; its diagnostics go to stderr (an invalid one's errors, a
/// valid one's warnings).
fn load(
    manifest: Option<PathBuf>,
) -> anyhow::Result<Option<(Manifest, RepoPaths, runtime::Sources)>> {
    let path = super::manifest_path(manifest)?;
    let (loaded, sources) = runtime::load_sourced(&path)?;
    let Some(model) = loaded.manifest else {
        for d in &loaded.diagnostics {
            errln!("{d}");
        }
        errln!(
            "error: `{}` is invalid; nothing was planned",
            path.display()
        );
        return Ok(None);
    };
    // A valid manifest's warnings (an MCP server's unset `${VAR}`) still
    // say what is missing.
    for d in &loaded.diagnostics {
        errln!("{d}");
    }
    let paths = RepoPaths::resolve(&path, &model.project.state_dir)?;
    Ok(Some((model, paths, sources)))
}

/// Where the repository keeps state, even when its manifest is invalid or
/// was deleted: with no manifest in the current directory, a daemon's
/// lock there still marks it as a repository.
pub(super) fn locate(manifest: Option<PathBuf>) -> anyhow::Result<RepoPaths> {
    let path = match super::manifest_path(manifest) {
        Ok(path) => path,
        Err(e) => {
            let fallback = PathBuf::from(crate::model::MANIFEST_NAMES[0]);
            let paths = RepoPaths::resolve(&fallback, crate::model::DEFAULT_STATE_DIR)?;
            if runtime::lock::holder(&paths.runtime_dir()).is_none() {
                return Err(e);
            }
            fallback
        }
    };
    Ok(RepoPaths::resolve(&path, &runtime::state_dir_hint(&path))?)
}

/// The daemon's control socket, if a daemon holds the repository.
pub(super) fn daemon_socket(paths: &RepoPaths) -> Option<(PathBuf, u32)> {
    paths.running_daemon()
}

/// What is applied, and how to say where that came from.
async fn observed(paths: &RepoPaths) -> anyhow::Result<(ObservedState, String)> {
    if let Some((socket, pid)) = daemon_socket(paths) {
        let answer = Client::call(&socket, &Request::State)
            .await
            .with_context(|| {
                format!("the daemon (pid {pid}) holds the repository but did not answer")
            })?;
        let Reply::State { components } = answer else {
            return Err(control::ControlError::unexpected(&answer).into());
        };
        return Ok((components, format!("the running daemon, pid {pid}")));
    }
    let db = paths.db();
    if let Some(store) = runtime::open_existing_store(paths)?
        && let Some(state) = runtime::stored_state(&store)?
    {
        return Ok((state, format!("the last applied state in {}", rel(&db))));
    }
    Ok((ObservedState::new(), "nothing applied yet".to_string()))
}

fn rel(path: &Path) -> String {
    let cwd = std::env::current_dir().unwrap_or_default();
    path.strip_prefix(&cwd)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A plan, the desired state it was computed from, and its fingerprint.
struct Computed {
    plan: Plan,
    desired: plan::Desired,
    fingerprint: String,
}

fn compute(
    model: &Manifest,
    paths: &RepoPaths,
    sources: &runtime::Sources,
    observed: &ObservedState,
) -> Computed {
    let inputs = runtime::external_inputs(model, &paths.root);
    let desired = plan::desired(model, &inputs);
    Computed {
        plan: plan::plan(&desired, observed),
        fingerprint: runtime::plan_fingerprint(sources, &inputs, observed),
        desired,
    }
}

/// The fingerprint of the plan `npc plan` would compute now, without a
/// daemon (what the last apply recorded as observed); `None` when the
/// manifest is invalid now.
fn fingerprint_now(manifest: &Path, paths: &RepoPaths) -> anyhow::Result<Option<String>> {
    let (loaded, sources) = runtime::load_sourced(manifest)?;
    let Some(model) = loaded.manifest else {
        return Ok(None);
    };
    let observed = match runtime::open_existing_store(paths)? {
        Some(store) => runtime::stored_state(&store)?.unwrap_or_default(),
        None => ObservedState::new(),
    };
    let inputs = runtime::external_inputs(&model, &paths.root);
    Ok(Some(runtime::plan_fingerprint(
        &sources, &inputs, &observed,
    )))
}

/// `npc plan --out FILE`'s format name and version; `npc apply FILE` reads
/// this version only.
pub const SAVED_PLAN_FORMAT: &str = "npc-plan";
pub const SAVED_PLAN_VERSION: u32 = 1;
/// Largest saved plan `npc apply FILE` reads.
pub const MAX_SAVED_PLAN_BYTES: u64 = 16 * 1024 * 1024;

/// A plan saved by `npc plan --out FILE`: what `npc apply FILE` applies,
/// refusing when anything it was computed from changed since.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct SavedPlan {
    pub format: String,
    pub version: u32,
    /// [`runtime::plan_fingerprint`] of the plan.
    pub fingerprint: String,
    /// The agent files it planned: the user-level ones, or the repository's.
    pub user: bool,
    /// Whether it planned replacing entries npc did not write.
    pub force_agent_files: bool,
    /// The plan as `npc plan --format json` shows it (for reading only).
    pub plan: serde_json::Value,
}

/// Why a saved plan cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum SavedPlanError {
    #[error("cannot read the saved plan `{path}`: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the saved plan `{path}` is not a regular file; save one with `npc plan --out FILE`")]
    NotAFile { path: PathBuf },
    #[error(
        "the saved plan `{path}` is larger than {MAX_SAVED_PLAN_BYTES} bytes; save it again with `npc plan --out FILE`"
    )]
    TooLarge { path: PathBuf },
    #[error("`{path}` is not a saved plan of npc: {error}; save one with `npc plan --out FILE`")]
    Malformed { path: PathBuf, error: String },
    #[error(
        "the saved plan `{path}` has version {found}; this npc reads version {SAVED_PLAN_VERSION}; save it again with `npc plan --out FILE`"
    )]
    Version { path: PathBuf, found: u32 },
}

/// Write `bytes` to `path`, readable by the owner only (a plan shows the
/// manifest's values).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}

impl SavedPlan {
    fn read(path: &Path) -> Result<Self, SavedPlanError> {
        use std::io::Read as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let read = |source| SavedPlanError::Read {
            path: path.to_path_buf(),
            source,
        };
        // Never blocks on a FIFO or a device: a regular file only.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(path)
            .map_err(read)?;
        if !file.metadata().map_err(read)?.is_file() {
            return Err(SavedPlanError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        let mut bytes = Vec::new();
        file.take(MAX_SAVED_PLAN_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
        if bytes.len() as u64 > MAX_SAVED_PLAN_BYTES {
            return Err(SavedPlanError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        let malformed = |error: String| SavedPlanError::Malformed {
            path: path.to_path_buf(),
            error,
        };
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| malformed(e.to_string()))?;
        if value["format"] != SAVED_PLAN_FORMAT {
            return Err(malformed(format!(
                "its `format` is not `{SAVED_PLAN_FORMAT}`"
            )));
        }
        match value["version"].as_u64() {
            Some(v) if v == u64::from(SAVED_PLAN_VERSION) => {}
            Some(v) => {
                return Err(SavedPlanError::Version {
                    path: path.to_path_buf(),
                    found: u32::try_from(v).unwrap_or(u32::MAX),
                });
            }
            None => return Err(malformed("it has no `version`".into())),
        }
        serde_json::from_value(value).map_err(|e| malformed(e.to_string()))
    }
}

/// The store for reading managed entries, if the repository has one.
fn read_store(paths: &RepoPaths) -> Option<Store> {
    runtime::open_existing_store(paths).ok().flatten()
}

/// Which agent files `plan` and `apply` look at, and how.
#[derive(Debug, Clone, Copy)]
pub struct FileOptions {
    /// The user-level files instead of the repository's.
    pub user: bool,
    /// Replace entries npc did not write that have a manifest server's name.
    pub force_agent_files: bool,
}

impl FileOptions {
    fn plan(&self, model: &Manifest, paths: &RepoPaths) -> anyhow::Result<Vec<FilePlan>> {
        Ok(files::plan_files_with(
            model,
            paths,
            read_store(paths).as_ref(),
            &scope(self.user)?,
            crate::native::PlanOptions {
                force: self.force_agent_files,
            },
        ))
    }
}

/// The plugin skill folders npc copies for the agents (project files only).
fn skill_plan(
    opts: &FileOptions,
    model: &Manifest,
    paths: &RepoPaths,
) -> Vec<crate::native::skills::SkillChange> {
    if opts.user {
        return Vec::new();
    }
    crate::native::skills::plan(model, &paths.root)
}

fn print_skills(skills: &[crate::native::skills::SkillChange]) -> Result<(), OutputError> {
    let shown: Vec<_> = skills
        .iter()
        .filter(|c| c.action != crate::native::skills::SkillAction::Unchanged)
        .collect();
    if shown.is_empty() {
        return Ok(());
    }
    outln!("\nPlugin skills npc copies for the agents:\n")?;
    for c in shown {
        let from = c
            .plugin
            .as_deref()
            .map(|p| format!("  (plugin `{p}`)"))
            .unwrap_or_default();
        outln!(
            "  {:>3} {}",
            c.action.symbol(),
            printable(&format!("{}{from}", c.path))
        )?;
        if let Some(note) = &c.note {
            outln!("        note: {}", printable(note))?;
        }
    }
    Ok(())
}

fn has_conflicts(files: &[FilePlan]) -> bool {
    files.iter().any(|f| !f.conflicts.is_empty())
}

fn print_files(files: &[FilePlan]) -> Result<(), OutputError> {
    let shown: Vec<&FilePlan> = files.iter().filter(|f| f.action != "unchanged").collect();
    print_conflicts(files)?;
    if shown.is_empty() {
        return Ok(());
    }
    outln!("\nFiles npc writes for the agents:\n")?;
    for f in shown {
        let symbol = match f.action {
            "create" => "+",
            "update" => "~",
            "remove" => "-",
            _ => "!",
        };
        // Paths, notes and diffs quote the agent files' own text.
        outln!("  {symbol:>3} {}  ({})", printable(&f.path), f.what)?;
        if let Some(e) = &f.error {
            outln!("        error: {}", printable(e))?;
        }
        for n in &f.notes {
            outln!("        note: {}", printable(n))?;
        }
        for line in f.diff.lines() {
            outln!("        {}", printable(line))?;
        }
    }
    Ok(())
}

/// Entries left alone because npc did not write them: shown whether or not
/// their file changes otherwise, with the flag that resolves them.
fn print_conflicts(files: &[FilePlan]) -> Result<(), OutputError> {
    if !has_conflicts(files) {
        return Ok(());
    }
    outln!("\nConflicts in agent files (left alone):\n")?;
    for f in files {
        for name in &f.conflicts {
            let entry = format!("{}: `{name}`", f.path);
            outln!(
                "    ! {} is an entry npc did not write; the manifest server of that name is not written there",
                printable(&entry)
            )?;
        }
    }
    outln!(
        "\n  Replace them with the manifest's servers: `npc apply --force-agent-files` (npc manages them from then on)."
    )
}

/// The gateway's tool names the manifest decides (`mcp.prefix =
/// "on_conflict"`), npc's built-ins reserved.
fn static_names(model: &Manifest, paths: &RepoPaths) -> crate::mcp::StaticNames {
    let builtins = crate::mcp::builtin::Builtins::standard(
        &paths.root,
        &model.mcp_builtins,
        std::sync::Arc::new(crate::runtime::npc_tools::NpcGroup::new(
            crate::runtime::npc_tools::NpcContext::new(paths.clone()),
        )),
    );
    crate::mcp::static_names(model, |n| builtins.contains(n))
}

fn print_names(names: &crate::mcp::StaticNames) -> Result<(), OutputError> {
    outln!(
        "
Gateway tool names (`mcp.prefix = \"on_conflict\"`):\n"
    )?;
    if names.prefixed.is_empty() {
        outln!("    no clash among the tools the manifest names (`enabled_tools`)")?;
    }
    for p in &names.prefixed {
        let with: Vec<String> = p.clashes_with.iter().map(|s| format!("`{s}`")).collect();
        outln!(
            "    {}  `{}` of `{}` clashes with {}",
            printable(&p.name),
            printable(&p.tool),
            printable(&p.server),
            printable(&with.join(", "))
        )?;
    }
    if !names.known_at_run_time.is_empty() {
        let servers: Vec<String> = names
            .known_at_run_time
            .iter()
            .map(|s| format!("`{s}`"))
            .collect();
        outln!(
            "\n  Named when they connect (no `enabled_tools`): {}; the gateway's log names their clashes.",
            printable(&servers.join(", "))
        )?;
    }
    outln!(
        "\n  Prompts and resource URIs are named when their servers connect, the same way (a clashing URI is `npc://SERVER/URI`)."
    )?;
    Ok(())
}

/// Project files by default; the user-level ones only when asked.
fn scope(user: bool) -> anyhow::Result<crate::native::Scope> {
    if !user {
        return Ok(crate::native::Scope::Project);
    }
    let home = std::env::var_os("HOME").ok_or_else(|| {
        anyhow::anyhow!("`--user` needs `HOME` to find the user-level agent config files")
    })?;
    Ok(crate::native::Scope::User {
        home: PathBuf::from(home),
    })
}

pub fn plan(
    manifest: Option<PathBuf>,
    format: Format,
    detailed_exitcode: bool,
    opts: FileOptions,
    out: Option<PathBuf>,
) -> anyhow::Result<Exit> {
    let Some((model, paths, sources)) = load(manifest)? else {
        return Ok(Exit::Failed);
    };
    let (observed, against) = tokio()?.block_on(observed(&paths))?;
    let Computed {
        plan, fingerprint, ..
    } = compute(&model, &paths, &sources, &observed);
    if let Some(out) = &out {
        let saved = SavedPlan {
            format: SAVED_PLAN_FORMAT.to_string(),
            version: SAVED_PLAN_VERSION,
            fingerprint: fingerprint.clone(),
            user: opts.user,
            force_agent_files: opts.force_agent_files,
            plan: plan::render_json(&plan, &against),
        };
        write_private(out, &serde_json::to_vec_pretty(&saved)?)
            .with_context(|| format!("cannot write the saved plan `{}`", out.display()))?;
    }
    let files = opts.plan(&model, &paths)?;
    let skills = skill_plan(&opts, &model, &paths);
    let skill_changes = skills.iter().any(|c| c.action.is_change());
    let file_changes =
        files.iter().any(FilePlan::is_change) || has_conflicts(&files) || skill_changes;
    let names = static_names(&model, &paths);
    match format {
        Format::Json => {
            let mut doc = plan::render_json(&plan, &against);
            doc["files"] = serde_json::to_value(&files)?;
            doc["skills"] = serde_json::to_value(&skills)?;
            if model.mcp.prefix == crate::model::Prefix::OnConflict {
                doc["mcp_names"] = serde_json::to_value(&names)?;
            }
            outln!("{}", serde_json::to_string_pretty(&doc)?)?;
        }
        Format::Human => {
            if plan.has_changes() || !(files.iter().any(FilePlan::is_change) || skill_changes) {
                out!("{}", plan::render_human(&plan, &against))?;
            }
            print_files(&files)?;
            print_skills(&skills)?;
            if model.mcp.prefix == crate::model::Prefix::OnConflict {
                print_names(&names)?;
            }
        }
    }
    if let Some(out) = &out
        && format == Format::Human
    {
        outln!(
            "\nSaved this plan to `{}`; `npc apply {}` applies exactly it.",
            printable(&out.display().to_string()),
            printable(&out.display().to_string())
        )?;
    }
    if files.iter().any(|f| f.error.is_some()) {
        return Ok(Exit::Failed);
    }
    Ok(
        if (plan.has_changes() || file_changes) && detailed_exitcode {
            Exit::Usage
        } else {
            Exit::Ok
        },
    )
}

pub fn apply(
    manifest: Option<PathBuf>,
    auto_approve: bool,
    opts: FileOptions,
    saved: Option<PathBuf>,
) -> anyhow::Result<Exit> {
    // A saved plan is applied as it was planned, without asking again.
    let (saved, auto_approve, opts) = match saved {
        Some(path) => {
            let saved = match SavedPlan::read(&path) {
                Ok(saved) => saved,
                Err(e) => {
                    errln!("error: {e}");
                    return Ok(Exit::Failed);
                }
            };
            let opts = FileOptions {
                user: saved.user,
                force_agent_files: saved.force_agent_files,
            };
            (Some(saved), true, opts)
        }
        None => (None, auto_approve, opts),
    };
    let manifest_path = super::manifest_path(manifest.clone())?;
    let Some((model, paths, sources)) = load(manifest)? else {
        return Ok(Exit::Failed);
    };
    let rt = tokio()?;
    let (observed, against) = rt.block_on(observed(&paths))?;
    let Computed {
        plan,
        desired,
        fingerprint,
    } = compute(&model, &paths, &sources, &observed);
    let stale = || {
        errln!("error: {}", runtime::STALE_PLAN);
        Ok(Exit::Failed)
    };
    if saved.as_ref().is_some_and(|s| s.fingerprint != fingerprint) {
        return stale();
    }
    let files = opts.plan(&model, &paths)?;
    let skills = skill_plan(&opts, &model, &paths);
    let skill_changes = skills.iter().any(|c| c.action.is_change());
    let file_changes = files.iter().any(FilePlan::is_change);
    if plan.has_changes() || !(file_changes || skill_changes) {
        out!("{}", plan::render_human(&plan, &against))?;
    }
    print_files(&files)?;
    print_skills(&skills)?;
    let file_changes = file_changes || skill_changes;
    // A broken agent file is left alone; everything else still applies.
    let broken = files.iter().any(|f| f.error.is_some());
    let report_broken = || {
        if broken {
            errln!(
                "error: npc left the files marked `!` above untouched; fix them, then apply again (everything else was applied)"
            );
        }
    };
    if !plan.has_changes() && !file_changes {
        report_broken();
        return Ok(if broken { Exit::Failed } else { Exit::Ok });
    }
    if plan.changes.iter().any(|c| c.action == Action::Refuse) {
        errln!(
            "error: the plan has changes npc cannot apply while it runs (marked `!`); nothing was applied"
        );
        return Ok(Exit::Failed);
    }
    if !auto_approve {
        if !std::io::stdin().is_terminal() {
            errln!(
                "error: stdin is not a terminal, so npc cannot ask; pass `--auto-approve` to apply without asking"
            );
            return Ok(Exit::Failed);
        }
        out!("\nApply these changes? Only `yes` applies: ")?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if answer.trim() != "yes" {
            outln!("Nothing applied.")?;
            return Ok(Exit::Failed);
        }
    }
    outln!()?;
    if let Some((socket, pid)) = daemon_socket(&paths) {
        let request = Request::Apply {
            fingerprint: Some(fingerprint),
        };
        let answer = rt
            .block_on(Client::call(&socket, &request))
            .with_context(|| format!("the daemon (pid {pid}) did not apply"))?;
        let Reply::Apply { outcome } = answer else {
            return Err(control::ControlError::unexpected(&answer).into());
        };
        let mut exit = print_outcome(&outcome, &format!("through the daemon (pid {pid})"))?;
        // The daemon never replaces an entry it did not write; a forced
        // replacement is written here, and the store records it as managed
        // so the daemon keeps it in step from now on.
        if opts.force_agent_files && file_changes && exit == Exit::Ok {
            let forced: Vec<FilePlan> = opts
                .plan(&model, &paths)?
                .into_iter()
                .filter(|f| f.is_change())
                .collect();
            let store = runtime::open_store(&paths)?;
            if !print_written(rt.block_on(files::write_files(&forced, &store, &paths.root)))? {
                exit = Exit::Failed;
            }
            rt.block_on(store.flush())?;
        }
        report_broken();
        return Ok(if broken { Exit::Failed } else { exit });
    }
    // No daemon: the one-shot parts. Record the applied state so plans and a
    // later daemon start from it; processes start with `npc daemon`.
    let _lock = runtime::lock::RepoLock::acquire(&paths.runtime_dir(), &paths.root)?;
    // What was shown is what is applied: anything it was computed from that
    // changed while npc asked (or since `npc plan --out`) refuses it.
    if fingerprint_now(&manifest_path, &paths)?.as_deref() != Some(fingerprint.as_str()) {
        return stale();
    }
    let store = runtime::open_store(&paths)?;
    rt.block_on(runtime::record_state(&store, &plan::observe(&desired)))?;
    let written: Vec<FilePlan> = files.into_iter().filter(|f| f.error.is_none()).collect();
    let failed =
        !print_written(rt.block_on(files::write_files(&written, &store, &paths.root)))? || broken;
    let failed = !print_written(crate::native::skills::apply(&paths.root, &skills))? || failed;
    for change in plan.actionable() {
        let runs_a_process = match desired.get(&change.id) {
            Some(plan::Config::McpServer(s)) => {
                matches!(s.transport, crate::model::McpTransport::Stdio(_))
            }
            Some(plan::Config::PanePlugin(_)) => true,
            _ => false,
        };
        let note = if change.action == Action::Remove {
            "removed"
        } else if runs_a_process {
            "recorded; its process starts with `npc daemon`"
        } else if change.id.kind == plan::Kind::Trigger {
            "recorded; it fires while `npc daemon` runs"
        } else {
            Standing::of_kind(change.id.kind).human()
        };
        outln!("  {:>3} {}: {note}", change.action.symbol(), change.id)?;
    }
    rt.block_on(store.flush())?;
    outln!("\nApplied without a daemon. Run `npc daemon` to start the supervised components.")?;
    report_broken();
    Ok(if failed { Exit::Failed } else { Exit::Ok })
}

/// One line per written file; whether every write succeeded.
fn print_written(
    results: Vec<(String, Result<&'static str, String>)>,
) -> Result<bool, OutputError> {
    let mut ok = true;
    for (path, outcome) in results {
        match outcome {
            Ok(what) => outln!("      {}: {what}", printable(&path))?,
            Err(e) => {
                ok = false;
                outln!("      {}", printable(&format!("{path}: not written: {e}")))?;
            }
        }
    }
    Ok(ok)
}

/// The daemon's start-up summary in words: one line (`npc daemon: startup
/// …`, what the first reconcile did), then one line per component that did
/// not start.
fn startup_lines(outcome: &runtime::ReloadOutcome) -> Vec<String> {
    use runtime::{Outcome, ReloadOutcome};
    let head = "npc daemon: startup";
    match outcome {
        ReloadOutcome::Applied { results } => {
            let count = |o: Outcome| results.iter().filter(|r| r.outcome == o).count();
            let running = results.iter().filter(|r| r.pid.is_some()).count();
            let failed = count(Outcome::Failed) + count(Outcome::RolledBack);
            let noun = |n: usize| if n == 1 { "component" } else { "components" };
            let mut lines = vec![format!(
                "{head}: {} {} up ({running} running a process), {failed} failed",
                results.len() - failed,
                noun(results.len() - failed),
            )];
            lines.extend(
                results
                    .iter()
                    .filter(|r| matches!(r.outcome, Outcome::Failed | Outcome::RolledBack))
                    .map(|r| {
                        format!(
                            "  {}: {}{}",
                            r.id,
                            r.outcome.as_str(),
                            r.error
                                .as_deref()
                                .map(|e| format!(": {e}"))
                                .unwrap_or_default()
                        )
                    }),
            );
            lines
        }
        ReloadOutcome::Invalid { error_count } => {
            vec![format!(
                "{head}: the manifest has {error_count} error(s); nothing runs"
            )]
        }
        ReloadOutcome::Failed { error } => vec![format!("{head}: failed: {error}")],
        ReloadOutcome::Refused { reasons } => {
            vec![format!("{head}: refused: {}", reasons.join("; "))]
        }
        ReloadOutcome::Stale => vec![format!("{head}: {}", runtime::STALE_PLAN)],
    }
}

fn print_outcome(outcome: &runtime::ReloadOutcome, how: &str) -> Result<Exit, OutputError> {
    use runtime::{Outcome, ReloadOutcome};
    match outcome {
        ReloadOutcome::Applied { results } => {
            let mut failed = false;
            for r in results {
                failed |= r.outcome != Outcome::Applied;
                // Say what "applied" means for a component no process stands for.
                let shown = match r.outcome {
                    Outcome::Applied if r.action == Action::Remove => "removed",
                    Outcome::Applied if r.pid.is_none() => Standing::of_kind(r.id.kind).human(),
                    outcome => outcome.as_str(),
                };
                let pid = r.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
                let error = r
                    .error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default();
                let line = format!("{}: {shown}{pid}{error}", r.id);
                outln!("  {:>3} {}", r.action.symbol(), printable(&line))?;
            }
            outln!("\nApplied {how}.")?;
            Ok(if failed { Exit::Failed } else { Exit::Ok })
        }
        ReloadOutcome::Invalid { .. } => {
            errln!(
                "error: the daemon found the manifest invalid; nothing changed (see `npc events`)"
            );
            Ok(Exit::Failed)
        }
        ReloadOutcome::Failed { error } => {
            errln!(
                "error: the daemon could not reload: {error}; it retries by itself (see `npc events`)"
            );
            Ok(Exit::Failed)
        }
        ReloadOutcome::Stale => {
            errln!("error: {}", runtime::STALE_PLAN);
            Ok(Exit::Failed)
        }
        ReloadOutcome::Refused { reasons } => {
            for r in reasons {
                errln!("error: refused: {r}");
            }
            Ok(Exit::Failed)
        }
    }
}

pub fn daemon(manifest: Option<PathBuf>) -> anyhow::Result<Exit> {
    runtime::daemon::fill_closed_std_fds();
    let path = super::manifest_path(manifest)?;
    super::log_to_stderr("info");
    let rt = tokio()?;
    let result = rt.block_on(runtime::daemon::run(&path, |paths, outcome, api, dashboard| {
        errln!(
            "npc daemon: pid {} watching {} (control socket {})",
            std::process::id(),
            paths.manifest.display(),
            control::socket_path(&paths.runtime_dir()).display()
        );
        for line in startup_lines(outcome) {
            errln!("{}", printable(&line));
        }
        if let Some(url) = api {
            errln!("npc daemon: API {url}/api/v1/status");
        }
        if let Some(url) = dashboard {
            errln!(
                "npc daemon: dashboard {url} (open it in a browser; the code serves once: `npc dashboard` prints a new one)"
            );
        }
    }));
    rt.shutdown_timeout(DAEMON_RUNTIME_SHUTDOWN);
    match result {
        Ok(()) => Ok(Exit::Ok),
        Err(runtime::RuntimeError::Invalid(p)) => {
            errln!(
                "error: `{}` is invalid; the daemon did not start",
                p.display()
            );
            Ok(Exit::Failed)
        }
        Err(e) => Err(e.into()),
    }
}

/// `npc dashboard`: the URL of the page the running daemon serves.
pub fn dashboard(manifest: Option<PathBuf>) -> anyhow::Result<Exit> {
    let paths = locate(manifest)?;
    let Some((socket, pid)) = daemon_socket(&paths) else {
        errln!(
            "error: no daemon runs for this repository; start one with `npc daemon`, which serves the dashboard"
        );
        return Ok(Exit::Failed);
    };
    let url = match tokio()?.block_on(Client::call(&socket, &Request::DashboardUrl)) {
        Ok(Reply::DashboardUrl { url }) => url,
        Ok(other) => return Err(control::ControlError::unexpected(&other).into()),
        Err(control::ControlError::Refused(e)) => {
            errln!("error: the daemon (pid {pid}): {e}");
            return Ok(Exit::Failed);
        }
        Err(e) => return Err(e.into()),
    };
    outln!("{url}")?;
    errln!(
        "open it in a browser; its one-time code opens a session of this browser and serves once"
    );
    Ok(Exit::Ok)
}

/// The human line of a daemon's shared store (`None` for the embedded one).
fn store_line(store: &serde_json::Value) -> Option<String> {
    if store["kind"] != "postgres" {
        return None;
    }
    let fleet = crate::stdx::term::printable(store["fleet"].as_str().unwrap_or("?"));
    let state = store["state"].as_str().unwrap_or("unknown");
    let role = match store["role"].as_str() {
        Some("ingress") => ", role ingress (takes webhooks, never schedules cron)",
        Some("scheduler") => ", role scheduler (schedules cron, takes no webhooks)",
        Some("all") => ", role all",
        _ => "",
    };
    let scheduling = match store["scheduling"].as_str() {
        Some("leader") => format!("{role}, cron scheduler: leader"),
        Some("standby") => format!("{role}, cron scheduler: standby"),
        _ => role.to_string(),
    };
    Some(match store["error"].as_str() {
        Some(error) => format!(
            "store PostgreSQL, fleet `{fleet}`: {state}: {}; the daemon keeps retrying{scheduling}",
            crate::stdx::term::printable(error)
        ),
        None => format!("store PostgreSQL, fleet `{fleet}`: {state}{scheduling}"),
    })
}

pub fn status(manifest: Option<PathBuf>, format: Format) -> anyhow::Result<Exit> {
    let paths = locate(manifest)?;
    let rt = tokio()?;
    let mut mcp_servers: Vec<serde_json::Value> = Vec::new();
    let mut gateway = MCP_GATEWAY_STANDALONE;
    let mut api: Option<String> = None;
    let mut store = serde_json::Value::Null;
    let (components, source): (Vec<runtime::ComponentStatus>, String) = match daemon_socket(&paths)
    {
        Some((socket, pid)) => {
            let answer = rt.block_on(Client::call(&socket, &Request::Status))?;
            let Reply::Status(answer) = answer else {
                return Err(control::ControlError::unexpected(&answer).into());
            };
            let answer = *answer;
            api = answer.api;
            store = answer.store;
            if let Some(servers) = answer.mcp["servers"].as_array() {
                gateway = MCP_GATEWAY_DAEMON;
                mcp_servers = servers.clone();
            }
            (answer.components, format!("daemon pid {pid}"))
        }
        None => {
            let rows = match runtime::open_existing_store(&paths)? {
                Some(store) => store.components()?,
                None => Vec::new(),
            };
            let rows = rows
                .into_iter()
                .map(|r| runtime::ComponentStatus {
                    id: format!("{}.{}", r.kind, r.name),
                    // Triggers fire only inside a daemon.
                    state: if r.state == "running" || r.state == "starting" || r.kind == "trigger" {
                        "not running".to_string()
                    } else {
                        r.state
                    },
                    kind: r.kind,
                    pid: None,
                    restarts: r.restarts,
                    since: chrono::DateTime::from_timestamp_millis(r.since_ms)
                        .map(|t| t.to_rfc3339()),
                    error: None,
                    detail: None,
                })
                .collect();
            (rows, "no daemon running; last recorded state".to_string())
        }
    };
    match format {
        Format::Json => {
            let rows: Vec<serde_json::Value> = components
                .iter()
                .map(|c| {
                    let mut row = serde_json::to_value(c).unwrap_or_default();
                    if let Some(standing) = standing(c) {
                        row["state"] = standing.state().into();
                        row["detail"] = standing.detail().into();
                    }
                    row
                })
                .collect();
            let mcp = serde_json::json!({ "gateway": gateway, "servers": mcp_servers });
            outln!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({ "source": source, "components": rows, "mcp": mcp, "api": api, "store": store })
                )?
            )?;
        }
        Format::Human => {
            outln!("{source}")?;
            if let Some(url) = &api {
                outln!("API {url}/api/v1")?;
            }
            if let Some(line) = store_line(&store) {
                outln!("{line}")?;
            }
            let states: Vec<String> = components
                .iter()
                .map(|c| standing(c).map_or_else(|| c.state.clone(), |s| s.human().to_string()))
                .collect();
            let width = components
                .iter()
                .map(|c| c.id.len())
                .max()
                .unwrap_or(9)
                .max(9);
            let state_width = states.iter().map(String::len).max().unwrap_or(11).max(11);
            outln!(
                "{:<width$}  {:<state_width$}  {:>7}  {:>8}  SINCE",
                "COMPONENT",
                "STATE",
                "PID",
                "RESTARTS"
            )?;
            for (c, state) in components.iter().zip(&states) {
                let pid = c.pid.map_or("-".to_string(), |p| p.to_string());
                let line = format!(
                    "{:<width$}  {state:<state_width$}  {:>7}  {:>8}  {}",
                    c.id,
                    pid,
                    c.restarts,
                    c.since
                        .as_deref()
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                        .map_or_else(
                            || "-".to_string(),
                            |t| super::human::when(Some(t.timestamp_millis()))
                        )
                );
                outln!("{}", printable(&line))?;
            }
            for c in &components {
                if let Some(error) = &c.error {
                    outln!("{}", printable(&format!("{}: {error}", c.id)))?;
                }
            }
            print_mcp_status(gateway, &mcp_servers)?;
        }
    }
    Ok(Exit::Ok)
}

/// `npc status`'s gateway value when a daemon owns the pool.
pub const MCP_GATEWAY_DAEMON: &str = "daemon";
/// `npc status`'s gateway value without a daemon.
pub const MCP_GATEWAY_STANDALONE: &str = "standalone";

/// The MCP part of `npc status`: which pool `npc mcp serve` uses, and each
/// server of the daemon's pool with its state, tools and last call.
fn print_mcp_status(gateway: &str, servers: &[serde_json::Value]) -> anyhow::Result<()> {
    outln!()?;
    if gateway == MCP_GATEWAY_DAEMON {
        outln!("MCP gateway: the daemon's pool (`npc mcp serve` fronts it)")?;
    } else {
        outln!("MCP gateway: standalone (`npc mcp serve` runs its own pool)")?;
    }
    if servers.is_empty() {
        return Ok(());
    }
    let text = |v: &serde_json::Value, key: &str| v[key].as_str().unwrap_or("-").to_string();
    let rows: Vec<[String; 4]> = servers
        .iter()
        .map(|s| {
            let state = match s["state"].as_str() {
                Some("failed") => format!("failed: {}", text(s, "reason")),
                Some(state) => state.to_string(),
                None => "-".to_string(),
            };
            let last = match s["last_call"].as_object() {
                Some(c) => format!(
                    "{} {}",
                    c.get("at").and_then(|v| v.as_str()).unwrap_or("-"),
                    c.get("tool").and_then(|v| v.as_str()).unwrap_or("-")
                ),
                None => "-".to_string(),
            };
            [text(s, "name"), state, s["tools"].to_string(), last]
        })
        .collect();
    let width = rows.iter().map(|r| r[0].len()).max().unwrap_or(10).max(10);
    let state_width = rows.iter().map(|r| r[1].len()).max().unwrap_or(5).max(5);
    outln!(
        "{:<width$}  {:<state_width$}  {:>5}  LAST CALL",
        "MCP SERVER",
        "STATE",
        "TOOLS"
    )?;
    // Names, failure reasons and tool names are the servers' own text.
    for [name, state, tools, last] in &rows {
        let line = format!("{name:<width$}  {state:<state_width$}  {tools:>5}  {last}");
        outln!("{}", printable(&line))?;
    }
    Ok(())
}

/// The standing of `c` when no process stands for it (`None`: a
/// supervised state such as `running`); older stores' `applied` included.
fn standing(c: &runtime::ComponentStatus) -> Option<Standing> {
    Standing::of_state(&c.kind, &c.state)
}

/// One event of a log as `npc events` prints it (and `npc events --fleet`).
pub(super) fn print_event(event: &serde_json::Value, format: Format) -> Result<(), OutputError> {
    match format {
        Format::Json => outln!("{event}")?,
        Format::Human => {
            let ts = super::human::when(event["ts_ms"].as_i64());
            let component = event["component"].as_str().unwrap_or("-");
            // What others wrote (a reason, a tool's name) may hold any
            // character: the line is made printable.
            let line = format!(
                "{:>6}  {ts}  {:<22}  {component:<24}  {}",
                event["id"],
                event["kind"].as_str().unwrap_or("?"),
                super::human::fields(&event["payload"])
            );
            outln!("{}", printable(line.trim_end()))?;
        }
    }
    Ok(())
}

pub fn events(
    manifest: Option<PathBuf>,
    since: Option<i64>,
    limit: Option<usize>,
    follow: bool,
    format: Format,
) -> anyhow::Result<Exit> {
    let paths = locate(manifest)?;
    // The last `limit` events: start after the one before them.
    let since = match limit {
        Some(n) => {
            let floor = match runtime::open_existing_store(&paths)? {
                Some(store) => store.id_before_last_events(n)?,
                None => 0,
            };
            Some(since.unwrap_or(0).max(floor))
        }
        None => since,
    };
    let rt = tokio()?;
    if let Some((socket, _)) = daemon_socket(&paths) {
        return rt.block_on(async {
            let mut client = Client::request(&socket, &Request::Events { since, follow }).await?;
            while let Some(reply) = client.next(None).await? {
                let Reply::Event { event } = reply else {
                    return Err(control::ControlError::unexpected(&reply).into());
                };
                print_event(&event, format)?;
            }
            Ok(Exit::Ok)
        });
    }
    let Some(store) = runtime::open_existing_store(&paths)? else {
        return Ok(Exit::Ok);
    };
    let mut after = since.unwrap_or(0);
    loop {
        let page = if follow {
            store.wait_for_events_after(after, runtime::daemon::EVENTS_PAGE, STORE_FOLLOW_WAIT)?
        } else {
            store.events_since(after, runtime::daemon::EVENTS_PAGE)?
        };
        if page.is_empty() && !follow {
            return Ok(Exit::Ok);
        }
        for event in &page {
            after = event.id;
            print_event(&serde_json::to_value(event)?, format)?;
        }
    }
}
