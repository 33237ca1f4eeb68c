//! `npc plan`, `npc apply`, `npc daemon`, `npc status` and `npc events`:
//! the reconciler's commands. Each talks to the running daemon through the
//! control channel when one runs, and to the store otherwise.

use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use super::{Exit, Format};
use crate::model::Manifest;
use crate::plan::{self, Action, ObservedState, Plan};
use crate::runtime::files::{self, FilePlan};
use crate::runtime::{self, RepoPaths};
use crate::store::Store;
use crate::surfaces::control::{self, Client, Request};

/// How long `npc events` without a daemon waits between looks at the store
/// while following (the daemon pushes events; the store can only be read).
pub const STORE_FOLLOW_WAIT: Duration = Duration::from_secs(1);

fn tokio() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// A valid manifest and where its repository keeps state; diagnostics go to
/// stderr when it is invalid.
fn load(manifest: Option<PathBuf>) -> anyhow::Result<Option<(Manifest, RepoPaths)>> {
    let path = super::manifest_path(manifest)?;
    let loaded = runtime::load_manifest(&path)?;
    let Some(model) = loaded.manifest else {
        for d in &loaded.diagnostics {
            eprintln!("{d}");
        }
        eprintln!(
            "error: `{}` is invalid; nothing was planned",
            path.display()
        );
        return Ok(None);
    };
    let paths = RepoPaths::resolve(&path, &model.project.state_dir)?;
    Ok(Some((model, paths)))
}

/// Where the repository keeps state, even when its manifest is invalid.
fn locate(manifest: Option<PathBuf>) -> anyhow::Result<RepoPaths> {
    let path = super::manifest_path(manifest)?;
    Ok(RepoPaths::resolve(&path, &runtime::state_dir_hint(&path))?)
}

/// The daemon's control socket, if a daemon holds the repository.
fn daemon_socket(paths: &RepoPaths) -> Option<(PathBuf, u32)> {
    let pid = runtime::lock::holder(&paths.state_dir)?;
    Some((control::socket_path(&paths.state_dir), pid))
}

/// What is applied, and how to say where that came from.
async fn observed(paths: &RepoPaths) -> anyhow::Result<(ObservedState, String)> {
    if let Some((socket, pid)) = daemon_socket(paths) {
        let answer = Client::call(&socket, &Request::State)
            .await
            .with_context(|| {
                format!("the daemon (pid {pid}) holds the repository but did not answer")
            })?;
        let text = answer.as_str().unwrap_or("{}");
        return Ok((
            runtime::decode_state(text),
            format!("the running daemon, pid {pid}"),
        ));
    }
    let db = paths.db();
    if db.is_file() {
        let store = Store::open_read_only(&db)?;
        if let Some(state) = runtime::stored_state(&store)? {
            return Ok((state, format!("the last applied state in {}", rel(&db))));
        }
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

fn compute(model: &Manifest, paths: &RepoPaths, observed: &ObservedState) -> Plan {
    let desired = plan::desired(model, &runtime::external_inputs(model, &paths.root));
    plan::plan(&desired, observed)
}

/// The store for reading managed entries, if the repository has one.
fn read_store(paths: &RepoPaths) -> Option<Store> {
    paths
        .db()
        .is_file()
        .then(|| Store::open_read_only(paths.db()).ok())
        .flatten()
}

fn print_files(files: &[FilePlan]) {
    let shown: Vec<&FilePlan> = files.iter().filter(|f| f.action != "unchanged").collect();
    if shown.is_empty() {
        return;
    }
    println!("\nFiles npc writes for the agents:\n");
    for f in shown {
        let symbol = match f.action {
            "create" => "+",
            "update" => "~",
            _ => "!",
        };
        println!("  {symbol:>3} {}  ({})", f.path, f.what);
        if let Some(e) = &f.error {
            println!("        error: {e}");
        }
        for n in &f.notes {
            println!("        note: {n}");
        }
        for line in f.diff.lines() {
            println!("        {line}");
        }
    }
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
    user: bool,
) -> anyhow::Result<Exit> {
    let Some((model, paths)) = load(manifest)? else {
        return Ok(Exit::Failed);
    };
    let (observed, against) = tokio()?.block_on(observed(&paths))?;
    let plan = compute(&model, &paths, &observed);
    let files = files::plan_files(&model, &paths, read_store(&paths).as_ref(), &scope(user)?);
    let file_changes = files.iter().any(FilePlan::is_change);
    match format {
        Format::Json => {
            let mut doc = plan::render_json(&plan, &against);
            doc["files"] = serde_json::to_value(&files)?;
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Format::Human => {
            if plan.has_changes() || !file_changes {
                print!("{}", plan::render_human(&plan, &against));
            }
            print_files(&files);
        }
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

pub fn apply(manifest: Option<PathBuf>, auto_approve: bool, user: bool) -> anyhow::Result<Exit> {
    let Some((model, paths)) = load(manifest)? else {
        return Ok(Exit::Failed);
    };
    let rt = tokio()?;
    let (observed, against) = rt.block_on(observed(&paths))?;
    let plan = compute(&model, &paths, &observed);
    let files = files::plan_files(&model, &paths, read_store(&paths).as_ref(), &scope(user)?);
    let file_changes = files.iter().any(FilePlan::is_change);
    if plan.has_changes() || !file_changes {
        print!("{}", plan::render_human(&plan, &against));
    }
    print_files(&files);
    if files.iter().any(|f| f.error.is_some()) {
        eprintln!(
            "error: npc cannot write the files marked `!` above; fix them, then apply again (nothing was applied)"
        );
        return Ok(Exit::Failed);
    }
    if !plan.has_changes() && !file_changes {
        return Ok(Exit::Ok);
    }
    if plan.changes.iter().any(|c| c.action == Action::Refuse) {
        eprintln!(
            "error: the plan has changes npc cannot apply while it runs (marked `!`); nothing was applied"
        );
        return Ok(Exit::Failed);
    }
    if !auto_approve {
        if !std::io::stdin().is_terminal() {
            eprintln!(
                "error: stdin is not a terminal, so npc cannot ask; pass `--auto-approve` to apply without asking"
            );
            return Ok(Exit::Failed);
        }
        print!("\nApply these changes? Only `yes` applies: ");
        std::io::stdout().flush()?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if answer.trim() != "yes" {
            println!("Nothing applied.");
            return Ok(Exit::Failed);
        }
    }
    println!();
    if let Some((socket, pid)) = daemon_socket(&paths) {
        let answer = rt
            .block_on(Client::call(&socket, &Request::Apply))
            .with_context(|| format!("the daemon (pid {pid}) did not apply"))?;
        return Ok(print_outcome(
            &answer,
            &format!("through the daemon (pid {pid})"),
        ));
    }
    // No daemon: the one-shot parts. Record the applied state so plans and a
    // later daemon start from it; processes start with `npc daemon`.
    let _lock = runtime::lock::RepoLock::acquire(&paths.state_dir, &paths.root)?;
    let store = Store::open(paths.db())?;
    let desired = plan::desired(&model, &runtime::external_inputs(&model, &paths.root));
    rt.block_on(runtime::record_state(&store, &plan::observe(&desired)))?;
    let mut failed = false;
    for (path, outcome) in rt.block_on(files::write_files(&files, &store)) {
        match outcome {
            Ok(what) => println!("      {path}: {what}"),
            Err(e) => {
                failed = true;
                println!("      {path}: not written: {e}");
            }
        }
    }
    for change in plan.actionable() {
        let note = match change.id.kind {
            plan::Kind::McpServer | plan::Kind::PanePlugin if change.action != Action::Remove => {
                "recorded; its process starts with `npc daemon`"
            }
            _ => "applied",
        };
        println!("  {:>3} {}: {note}", change.action.symbol(), change.id);
    }
    rt.block_on(store.flush())?;
    println!("\nApplied without a daemon. Run `npc daemon` to start the supervised components.");
    Ok(if failed { Exit::Failed } else { Exit::Ok })
}

fn print_outcome(answer: &serde_json::Value, how: &str) -> Exit {
    match answer.get("outcome").and_then(|o| o.as_str()) {
        Some("applied") => {
            let mut failed = false;
            for r in answer["results"].as_array().into_iter().flatten() {
                let outcome = r["outcome"].as_str().unwrap_or("?");
                failed |= outcome != "applied";
                let symbol = serde_json::from_value::<Action>(r["action"].clone())
                    .map(|a| a.symbol())
                    .unwrap_or("?");
                let pid = r["pid"]
                    .as_u64()
                    .map(|p| format!(" (pid {p})"))
                    .unwrap_or_default();
                let error = r["error"]
                    .as_str()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default();
                println!(
                    "  {symbol:>3} {}: {outcome}{pid}{error}",
                    r["id"].as_str().unwrap_or("?")
                );
            }
            println!("\nApplied {how}.");
            if failed { Exit::Failed } else { Exit::Ok }
        }
        Some("invalid") => {
            eprintln!(
                "error: the daemon found the manifest invalid; nothing changed (see `npc events`)"
            );
            Exit::Failed
        }
        Some("failed") => {
            eprintln!(
                "error: the daemon could not reload: {}; it retries by itself (see `npc events`)",
                answer["error"].as_str().unwrap_or("?")
            );
            Exit::Failed
        }
        Some("refused") => {
            for r in answer["reasons"].as_array().into_iter().flatten() {
                eprintln!("error: refused: {}", r.as_str().unwrap_or("?"));
            }
            Exit::Failed
        }
        _ => {
            eprintln!("error: unexpected answer from the daemon: {answer}");
            Exit::Failed
        }
    }
}

pub fn daemon(manifest: Option<PathBuf>) -> anyhow::Result<Exit> {
    let path = super::manifest_path(manifest)?;
    let filter = std::env::var("NPC_LOG").unwrap_or_else(|_| "info".to_string());
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .try_init();
    let rt = tokio()?;
    let result = rt.block_on(runtime::daemon::run(&path, |paths, outcome| {
        eprintln!(
            "npc daemon: pid {} watching {} (control socket {})",
            std::process::id(),
            paths.manifest.display(),
            control::socket_path(&paths.state_dir).display()
        );
        eprintln!(
            "npc daemon: startup {}",
            serde_json::to_string(outcome).unwrap_or_default()
        );
    }));
    rt.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(()) => Ok(Exit::Ok),
        Err(runtime::RuntimeError::Invalid(p)) => {
            eprintln!(
                "error: `{}` is invalid; the daemon did not start",
                p.display()
            );
            Ok(Exit::Failed)
        }
        Err(e) => Err(e.into()),
    }
}

pub fn status(manifest: Option<PathBuf>, format: Format) -> anyhow::Result<Exit> {
    let paths = locate(manifest)?;
    let rt = tokio()?;
    let (components, source): (Vec<runtime::ComponentStatus>, String) = match daemon_socket(&paths)
    {
        Some((socket, pid)) => {
            let answer = rt.block_on(Client::call(&socket, &Request::Status))?;
            (
                serde_json::from_value(answer["components"].clone()).unwrap_or_default(),
                format!("daemon pid {pid}"),
            )
        }
        None => {
            let rows = if paths.db().is_file() {
                Store::open_read_only(paths.db())?.components()?
            } else {
                Vec::new()
            };
            let rows = rows
                .into_iter()
                .map(|r| runtime::ComponentStatus {
                    id: format!("{}.{}", r.kind, r.name),
                    kind: r.kind,
                    state: if r.state == "running" || r.state == "starting" {
                        "not running".to_string()
                    } else {
                        r.state
                    },
                    pid: None,
                    restarts: r.restarts,
                    since: chrono::DateTime::from_timestamp_millis(r.since_ms)
                        .map(|t| t.to_rfc3339()),
                })
                .collect();
            (rows, "no daemon running; last recorded state".to_string())
        }
    };
    match format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "source": source, "components": components })
            )?
        ),
        Format::Human => {
            println!("{source}");
            let width = components
                .iter()
                .map(|c| c.id.len())
                .max()
                .unwrap_or(9)
                .max(9);
            println!(
                "{:<width$}  {:<11}  {:>7}  {:>8}  SINCE",
                "COMPONENT", "STATE", "PID", "RESTARTS"
            );
            for c in &components {
                let pid = c.pid.map_or("-".to_string(), |p| p.to_string());
                println!(
                    "{:<width$}  {:<11}  {:>7}  {:>8}  {}",
                    c.id,
                    c.state,
                    pid,
                    c.restarts,
                    c.since.as_deref().unwrap_or("-")
                );
            }
        }
    }
    Ok(Exit::Ok)
}

fn print_event(event: &serde_json::Value, format: Format) {
    match format {
        Format::Json => println!("{event}"),
        Format::Human => {
            let ts = event["ts_ms"]
                .as_i64()
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
                .unwrap_or_default();
            let component = event["component"].as_str().unwrap_or("-");
            println!(
                "{:>6}  {ts}  {:<22}  {component:<24}  {}",
                event["id"],
                event["kind"].as_str().unwrap_or("?"),
                event["payload"]
            );
        }
    }
}

pub fn events(
    manifest: Option<PathBuf>,
    since: Option<i64>,
    follow: bool,
    format: Format,
) -> anyhow::Result<Exit> {
    let paths = locate(manifest)?;
    let rt = tokio()?;
    if let Some((socket, _)) = daemon_socket(&paths) {
        return rt.block_on(async {
            let mut client = Client::request(&socket, &Request::Events { since, follow }).await?;
            while let Some(event) = client.next(None).await? {
                print_event(&event, format);
            }
            Ok(Exit::Ok)
        });
    }
    if !paths.db().is_file() {
        return Ok(Exit::Ok);
    }
    let store = Store::open_read_only(paths.db())?;
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
            print_event(&serde_json::to_value(event)?, format);
        }
    }
}
