//! `npc plugin …`: Agent Plugins 1.0 packages. `validate` checks a package
//! statically (nothing executed, nothing created), printing every problem
//! with its file and JSON Pointer, like `npc validate` (human or JSON).

use std::path::PathBuf;

use clap::Subcommand;
use serde::Serialize;

use super::{Exit, Format};
use crate::model::diagnostics::Severity;
use crate::plugins::{self, Problem, Report};

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Check a package statically: plugin.json, mcp.json, skills, hooks; nothing is run
    Validate {
        /// Package directory (default: the current directory)
        #[arg(default_value = ".")]
        path: PathBuf,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
}

pub fn run(command: PluginCommand) -> anyhow::Result<Exit> {
    match command {
        PluginCommand::Validate { path, format } => validate(&path, format),
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
                error_count: report.error_count() + report.omitted,
                warning_count: report.warning_count(),
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
            let errors = report.error_count() + report.omitted;
            let warnings = report.warning_count();
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
            out!("{out}")?;
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
