//! `npc plugin …`: Agent Plugins 1.0 packages. `validate` checks a package
//! statically (nothing executed, nothing created), printing every problem
//! with its file and JSON Pointer, like `npc validate` (human or JSON).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Subcommand;
use serde::Serialize;

use super::{Exit, Format};
use crate::model::diagnostics::Severity;
use crate::plugins::{self, Problem, Report};
use crate::stdx::term::printable;

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Check a package statically: plugin.json, mcp.json, skills, hooks; nothing is run
    Validate {
        /// Package directory (default: the current directory)
        #[arg(default_value = ".")]
        path: PathBuf,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Run a package once: list its skills, probe each stdio MCP server, run each hook with a sample payload
    Test {
        /// Package directory (default: the current directory)
        #[arg(default_value = ".")]
        path: PathBuf,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Register a package in the user-level registry (disabled); same name and path again is a no-op
    Install {
        /// Package directory (default: the current directory)
        #[arg(default_value = ".")]
        path: PathBuf,
    },
    /// Enable a registered plugin (revalidates it first)
    Enable { name: String },
    /// Disable a registered plugin
    Disable { name: String },
    /// Remove a registration; the package and its data stay
    Uninstall { name: String },
    /// The plugins of this repository's manifest, the user registry and built-ins, in discovery order
    List {
        /// Show each plugin's servers, skills and hooks
        #[arg(long)]
        tools: bool,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory; none is fine)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// One plugin in detail: where it is, its state and its components
    Inspect {
        name: String,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Write a new package that passes `validate` and `test` (refuses a non-empty target)
    Init {
        /// The plugin's name (1–64 of `a-z`, `0-9`, inner `.` or `-`)
        name: String,
        /// Python MCP server (Python 3.11+, the MCP Python SDK); the default
        #[arg(long, visible_alias = "py", conflicts_with = "typescript")]
        python: bool,
        /// TypeScript MCP server (Node 20+, the 1.x MCP TypeScript SDK)
        #[arg(long, visible_alias = "ts")]
        typescript: bool,
        /// Directory to write (default: ./NAME)
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

pub fn run(command: PluginCommand) -> anyhow::Result<Exit> {
    match command {
        PluginCommand::Validate { path, format } => validate(&path, format),
        PluginCommand::Test { path, format } => test(&path, format),
        PluginCommand::Install { path } => install(&path),
        PluginCommand::Enable { name } => set_enabled(&name, true),
        PluginCommand::Disable { name } => set_enabled(&name, false),
        PluginCommand::Uninstall { name } => uninstall(&name),
        PluginCommand::List {
            tools,
            manifest,
            format,
        } => list(tools, manifest, format),
        PluginCommand::Inspect {
            name,
            manifest,
            format,
        } => inspect(&name, manifest, format),
        PluginCommand::Init {
            name,
            python: _,
            typescript,
            dir,
        } => init(&name, typescript, dir),
    }
}

/// The JSON document of `npc plugin validate --format json`: the shape of
/// `npc validate --format json`, each diagnostic placed by file and pointer.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    format_version: &'static str,
    valid: bool,
    error_count: usize,
    warning_count: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    plugin: Option<&'a str>,
    diagnostics: Vec<JsonDiagnostic<'a>>,
    #[serde(skip_serializing_if = "is_zero")]
    omitted: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Serialize)]
struct JsonDiagnostic<'a> {
    severity: Severity,
    summary: &'a str,
    detail: &'a str,
    file: &'a str,
    pointer: &'a str,
}

impl<'a> From<&'a Problem> for JsonDiagnostic<'a> {
    fn from(p: &'a Problem) -> Self {
        Self {
            severity: p.severity,
            summary: &p.message,
            detail: p.hint.as_deref().unwrap_or(""),
            file: &p.file,
            pointer: &p.pointer,
        }
    }
}

fn validate(path: &std::path::Path, format: Format) -> anyhow::Result<Exit> {
    let report = plugins::validate(path)?;
    print_report(path, &report, format)?;
    Ok(if report.is_valid() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

fn print_report(path: &std::path::Path, report: &Report, format: Format) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            let doc = JsonReport {
                format_version: "1",
                valid: report.is_valid(),
                error_count: report.error_count() + report.omitted_errors,
                warning_count: report.warning_count() + report.omitted - report.omitted_errors,
                plugin: report.package.as_ref().map(|p| p.manifest.name.as_str()),
                diagnostics: report.problems.iter().map(JsonDiagnostic::from).collect(),
                omitted: report.omitted,
            };
            outln!("{}", serde_json::to_string_pretty(&doc)?)?;
        }
        Format::Human => {
            let mut out = String::new();
            for p in &report.problems {
                out.push_str(&p.to_string());
                out.push('\n');
            }
            if report.omitted > 0 {
                out.push_str(&format!(
                    "… and {} more problems not shown\n",
                    report.omitted
                ));
            }
            let shown = path.display();
            let errors = report.error_count() + report.omitted_errors;
            let warnings = report.warning_count() + report.omitted - report.omitted_errors;
            match &report.package {
                Some(pkg) if errors == 0 => out.push_str(&format!(
                    "{shown}: valid{} (plugin `{}`: {})\n",
                    if warnings > 0 {
                        format!(" with {}", plural(warnings, "warning"))
                    } else {
                        String::new()
                    },
                    pkg.manifest.name,
                    summary(pkg)
                )),
                _ => out.push_str(&format!(
                    "{shown}: invalid: {}{}\n",
                    plural(errors, "error"),
                    if warnings > 0 {
                        format!(", {}", plural(warnings, "warning"))
                    } else {
                        String::new()
                    }
                )),
            }
            out!("{}", printable(&out))?;
        }
    }
    Ok(())
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// "1 MCP server, 2 skills, 3 hooks", or "empty".
fn summary(pkg: &plugins::Package) -> String {
    let hooks = pkg.hooks.as_ref().map_or(0, plugins::hooks::HooksFile::len);
    let parts = [
        (pkg.servers.len(), "MCP server"),
        (pkg.skills.len(), "skill"),
        (hooks, "hook"),
    ];
    let shown: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, w)| plural(*n, w))
        .collect();
    if shown.is_empty() {
        "no components".to_string()
    } else {
        shown.join(", ")
    }
}

fn init(name: &str, typescript: bool, dir: Option<PathBuf>) -> anyhow::Result<Exit> {
    use crate::plugins::scaffold::{self, Language};
    if !scaffold::valid_name(name) {
        errln!(
            "error: `{}` is not a valid plugin name",
            crate::model::diagnostics::clip(name)
        );
        errln!(
            "  = help: use 1 to 64 characters `a-z`, `0-9`, with inner `.` or `-` and no `--` or `..`"
        );
        return Ok(Exit::Usage);
    }
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    if let Ok(mut entries) = std::fs::read_dir(&dir)
        && entries.next().is_some()
    {
        errln!(
            "error: `{}` is not empty; npc plugin init writes only into an empty or new directory",
            dir.display()
        );
        errln!("  = help: choose another directory with `--dir`, or remove its contents");
        return Ok(Exit::Usage);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
    let root = crate::repofs::Root::new(&dir)?;
    let language = if typescript {
        Language::TypeScript
    } else {
        Language::Python
    };
    for file in scaffold::files(name, language) {
        let path = std::path::Path::new(&file.path);
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            root.create_dir_all(parent, crate::repofs::Perms::Shared)?;
        }
        root.create_new(path, file.text.as_bytes(), crate::repofs::Perms::Shared)
            .with_context(|| format!("cannot create `{}`", dir.join(path).display()))?;
    }
    outln!("wrote plugin `{name}` in {}", dir.display())?;
    outln!(
        "next: run `npc plugin validate {0}` and `npc plugin test {0}`",
        dir.display()
    )?;
    Ok(Exit::Ok)
}

/// What `npc plugin test --format json` prints.
#[derive(Debug, Serialize)]
struct TestReport<'a> {
    plugin: &'a str,
    ok: bool,
    skills: Vec<&'a str>,
    servers: Vec<crate::plugins::probe::ServerProbe>,
    hooks: Vec<crate::plugins::probe::HookProbe>,
}

fn test(path: &std::path::Path, format: Format) -> anyhow::Result<Exit> {
    use crate::plugins::{expand::Placeholders, probe};
    let report = plugins::validate(path)?;
    let Some(pkg) = report
        .package
        .as_ref()
        .filter(|_| report.error_count() == 0)
    else {
        print_report(path, &report, Format::Human)?;
        errln!("error: the package is invalid; fix it before `npc plugin test` runs it");
        return Ok(Exit::Failed);
    };
    let data = plugins::data::ensure(&pkg.manifest.name)?;
    let places = Placeholders {
        root: &pkg.root,
        data: &data,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (servers, hooks) = rt.block_on(async {
        let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
        let supervisor = crate::supervisor::Supervisor::new(events, Default::default());
        let mut servers = Vec::new();
        for s in &pkg.servers {
            servers.push(probe::probe_server(&supervisor, s, &places).await);
        }
        let mut hooks = Vec::new();
        if let Some(file) = &pkg.hooks {
            for (event, entries) in &file.hooks {
                for (i, entry) in entries.iter().enumerate() {
                    hooks.push(
                        probe::run_hook(&supervisor, &pkg.manifest.name, *event, i, entry, &places)
                            .await,
                    );
                }
            }
        }
        (servers, hooks)
    });
    let ok = servers.iter().all(|s| s.ok) && hooks.iter().all(|h| h.ok);
    match format {
        Format::Json => {
            let doc = TestReport {
                plugin: &pkg.manifest.name,
                ok,
                skills: pkg.skills.iter().map(|s| s.name.as_str()).collect(),
                servers,
                hooks,
            };
            outln!("{}", serde_json::to_string_pretty(&doc)?)?;
        }
        Format::Human => {
            let mut out = format!("plugin `{}` at {}\n", pkg.manifest.name, pkg.root.display());
            for s in &pkg.skills {
                out.push_str(&format!(
                    "  skill  {}: {}\n",
                    s.name,
                    crate::model::diagnostics::clip(&s.description)
                ));
            }
            for s in &servers {
                match &s.error {
                    None if s.skipped.is_some() => out.push_str(&format!(
                        "  mcp    {}: skipped: {}\n",
                        s.server,
                        s.skipped.as_deref().unwrap_or("")
                    )),
                    None => out.push_str(&format!(
                        "  mcp    {}: ok, {} ({})\n",
                        s.server,
                        plural(s.tools.len(), "tool"),
                        s.tools.join(", ")
                    )),
                    Some(e) => out.push_str(&format!("  mcp    {}: failed: {e}\n", s.server)),
                }
            }
            for h in &hooks {
                let what = format!("{}[{}] `{}`", h.event.as_str(), h.index, h.command);
                match (&h.decision, &h.error) {
                    (Some(d), _) => out.push_str(&format!("  hook   {what}: {d}\n")),
                    (_, Some(e)) => out.push_str(&format!("  hook   {what}: failed: {e}\n")),
                    _ => {}
                }
            }
            out.push_str(if ok {
                "all probes passed\n"
            } else {
                "some probes failed\n"
            });
            out!("{}", printable(&out))?;
        }
    }
    Ok(if ok { Exit::Ok } else { Exit::Failed })
}

fn install(path: &std::path::Path) -> anyhow::Result<Exit> {
    use crate::plugins::registry::{self, Installed};
    let report = plugins::validate(path)?;
    let Some(pkg) = &report.package else {
        print_report(path, &report, Format::Human)?;
        errln!(
            "error: `{}` is not a loadable Agent Plugins package; nothing was installed",
            path.display()
        );
        return Ok(Exit::Failed);
    };
    let mut reg = registry::load()?;
    let name = pkg.manifest.name.clone();
    match reg.install(&name, &pkg.root) {
        Ok(Installed::AlreadyThere) => {
            outln!(
                "plugin `{name}` is already installed from {}",
                pkg.root.display()
            )?;
        }
        Ok(Installed::New) => {
            registry::save(&reg)?;
            outln!(
                "installed plugin `{name}` from {} (disabled)",
                pkg.root.display()
            )?;
            outln!("next: run `npc plugin enable {name}`")?;
        }
        Err(e) => {
            errln!("error: {e}");
            return Ok(Exit::Failed);
        }
    }
    Ok(Exit::Ok)
}

fn set_enabled(name: &str, enabled: bool) -> anyhow::Result<Exit> {
    use crate::plugins::registry;
    let mut reg = registry::load()?;
    let entry = match reg.get(name) {
        Ok(e) => e.clone(),
        Err(e) => {
            errln!("error: {e}");
            return Ok(Exit::Failed);
        }
    };
    if enabled {
        let report = match plugins::validate(&entry.path) {
            Ok(r) => r,
            Err(e) => {
                errln!("error: {e}; plugin `{name}` stays disabled");
                return Ok(Exit::Failed);
            }
        };
        let renamed = report
            .package
            .as_ref()
            .is_some_and(|p| p.manifest.name != name);
        if !report.is_valid() || renamed {
            print_report(&entry.path, &report, Format::Human)?;
            if renamed {
                errln!(
                    "error: the package at `{}` is no longer named `{name}`",
                    entry.path.display()
                );
            }
            errln!(
                "error: plugin `{name}` is invalid and stays disabled; fix it and run `npc plugin enable {name}` again"
            );
            return Ok(Exit::Failed);
        }
    }
    reg.set_enabled(name, enabled)?;
    registry::save(&reg)?;
    outln!(
        "plugin `{name}` {}",
        if enabled { "enabled" } else { "disabled" }
    )?;
    Ok(Exit::Ok)
}

fn uninstall(name: &str) -> anyhow::Result<Exit> {
    use crate::plugins::registry;
    let mut reg = registry::load()?;
    match reg.uninstall(name) {
        Ok(entry) => {
            registry::save(&reg)?;
            outln!(
                "uninstalled plugin `{name}`; its package ({}) and data are left in place",
                entry.path.display()
            )?;
            Ok(Exit::Ok)
        }
        Err(e) => {
            errln!("error: {e}");
            Ok(Exit::Failed)
        }
    }
}

type Row = crate::api::listings::PluginRow;

/// Every plugin in discovery order (manifest, user registry), deduplicated;
/// collisions are reported on stderr.
fn discover(manifest: Option<PathBuf>) -> anyhow::Result<Vec<Row>> {
    let path = super::manifest_path(manifest).ok();
    let listing = crate::api::listings::plugin_rows(path.as_deref())?;
    if let Some(path) = &listing.invalid_manifest {
        errln!(
            "warning: `{}` is invalid; its plugins are not listed (see `npc validate`)",
            path.display()
        );
    }
    for c in &listing.collisions {
        errln!(
            "warning: plugin `{}` from the {} registration is also registered by the {} one ({}); the first is kept (`{}`)",
            c.id,
            c.kept.as_str(),
            c.dropped.as_str(),
            c.dropped_path.display(),
            c.policy
        );
    }
    Ok(listing.rows)
}

fn list(tools: bool, manifest: Option<PathBuf>, format: Format) -> anyhow::Result<Exit> {
    let rows = discover(manifest)?;
    if format == Format::Json {
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(Exit::Ok);
    }
    if rows.is_empty() {
        outln!(
            "no plugins; add `[plugins.NAME]` to the manifest or run `npc plugin install PATH`"
        )?;
        return Ok(Exit::Ok);
    }
    let mut table = vec![vec![
        "KIND".to_string(),
        "ID".into(),
        "VERSION".into(),
        "SOURCE".into(),
        "STATE".into(),
    ]];
    if tools {
        table[0].push("TOOLS".into());
    }
    for r in &rows {
        let mut line = vec![
            r.kind.to_string(),
            r.id.clone(),
            r.version.clone().unwrap_or_else(|| "-".into()),
            r.source.to_string(),
            if r.package == "valid" {
                r.saved.to_string()
            } else {
                format!("{} (invalid)", r.saved)
            },
        ];
        if tools {
            line.push(components(r));
        }
        table.push(line);
    }
    let widths: Vec<usize> = (0..table[0].len())
        .map(|i| {
            table
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in table {
        let cells: Vec<String> = line
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out!("{}", printable(&out))?;
    Ok(Exit::Ok)
}

/// "mcp: a, b; skills: x; hooks: 2" or "-".
fn components(r: &Row) -> String {
    let mut parts = Vec::new();
    if !r.servers.is_empty() {
        parts.push(format!("mcp: {}", r.servers.join(", ")));
    }
    if !r.skills.is_empty() {
        parts.push(format!("skills: {}", r.skills.join(", ")));
    }
    if r.hooks > 0 {
        parts.push(format!("hooks: {}", r.hooks));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join("; ")
    }
}

fn inspect(name: &str, manifest: Option<PathBuf>, format: Format) -> anyhow::Result<Exit> {
    let Some(row) = discover(manifest)?.into_iter().find(|r| r.id == name) else {
        errln!(
            "error: no plugin `{name}` in the manifest or the user registry; see `npc plugin list`"
        );
        return Ok(Exit::Failed);
    };
    if format == Format::Json {
        outln!("{}", serde_json::to_string_pretty(&row)?)?;
        return Ok(Exit::Ok);
    }
    let mut out = format!("plugin `{}`\n", row.id);
    out.push_str(&format!(
        "  version  {}\n",
        row.version.as_deref().unwrap_or("-")
    ));
    out.push_str(&format!(
        "  source   {} ({})\n",
        row.source,
        row.path.display()
    ));
    out.push_str(&format!(
        "  state    {}, package {}\n",
        row.saved, row.package
    ));
    out.push_str(&format!(
        "  mcp      {}\n",
        if row.servers.is_empty() {
            "-".into()
        } else {
            row.servers.join(", ")
        }
    ));
    out.push_str(&format!(
        "  skills   {}\n",
        if row.skills.is_empty() {
            "-".into()
        } else {
            row.skills.join(", ")
        }
    ));
    out.push_str(&format!("  hooks    {}\n", row.hooks));
    if let Ok(data) = plugins::data::dir_of(&row.id) {
        out.push_str(&format!("  data     {}\n", data.display()));
    }
    out!("{}", printable(&out))?;
    Ok(Exit::Ok)
}
