//! `npc doctor`: for each agent CLI the manifest declares, whether it is
//! installed, its version against the versions npc's parser was recorded
//! with (`fixtures/clis`), whether the agent files npc writes for it are in
//! step with the manifest, and whether the CLI reads them: Codex's project
//! trust and its review of npc's hooks, Gemini CLI's folder trust (the
//! rules in `native::doctor`), and whether it is logged in as far as npc
//! can tell; then whether the `npc` the agent files call is this npc, and
//! whether each stdio MCP server's command exists. No program a repository
//! names, and none found through a relative `PATH` entry, is ever run.
//! Every problem comes with the command or the edit that fixes it. Exit 0 when nothing is wrong (warnings allowed), 1
//! otherwise.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::{Exit, Format};
use crate::model::{Manifest, Provider, ProviderKind};
use crate::native::doctor::{self as checks, GeminiTrust};
use crate::runtime::{self, RepoPaths};

/// The program the agent files npc writes call.
const NPC_PROGRAM: &str = "npc";
/// Longest a CLI's `--version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(15);
/// Codex's flag that runs project hooks without a stored review.
const CODEX_BYPASS_HOOK_TRUST: &str = "--dangerously-bypass-hook-trust";
/// Where, under the user's `.gemini`, Gemini CLI keeps the project agents
/// the user acknowledged.
const GEMINI_AGENT_ACKS: &str = "acknowledgments/agents.json";
/// Gemini CLI's flag and variable that trust the folder for one run.
const GEMINI_SKIP_TRUST: &str = "--skip-trust";
const GEMINI_TRUST_ENV: &str = "GEMINI_CLI_TRUST_WORKSPACE";

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
    #[arg(long, value_enum, default_value_t)]
    format: Format,
    /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
    #[arg(long, short = 'm')]
    manifest: Option<PathBuf>,
}

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Ok,
    /// Worth knowing; nothing is broken yet.
    Warn,
    Problem,
}

#[derive(Debug, Serialize)]
struct Check {
    check: &'static str,
    status: Status,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

impl Check {
    fn ok(check: &'static str, detail: String) -> Self {
        Self {
            check,
            status: Status::Ok,
            detail,
            fix: None,
        }
    }

    fn bad(check: &'static str, status: Status, detail: String, fix: String) -> Self {
        Self {
            check,
            status,
            detail,
            fix: Some(fix),
        }
    }
}

/// One CLI's report.
#[derive(Debug, Serialize)]
struct Report {
    /// An agent CLI's kind, `npc` (the npc the agent files call) or
    /// `mcp_server`.
    kind: &'static str,
    /// The MCP server's name (`mcp_server` reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<String>,
    program: String,
    path: Option<PathBuf>,
    version: Option<String>,
    /// The newest version npc's parser was recorded with.
    fixtures: Option<String>,
    checks: Vec<Check>,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<Exit> {
    let path = super::manifest_path(args.manifest)?;
    let paths = RepoPaths::resolve(&path, &runtime::state_dir_hint(&path))?;
    let Some(manifest) = super::valid_manifest(&paths.manifest, "before checking the agents")?
    else {
        return Ok(Exit::Failed);
    };
    // One report per CLI, and one more for its ACP program where a
    // provider drives it over ACP.
    let mut providers: BTreeMap<(ProviderKind, bool), &Provider> = BTreeMap::new();
    for provider in manifest.providers.values() {
        let acp = provider.driver == crate::model::ProviderDriver::Acp;
        providers.entry((provider.kind, acp)).or_insert(provider);
    }
    let plans = agent_file_plans(&manifest, &paths);
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut reports: Vec<Report> = Vec::new();
    if !providers.is_empty() {
        reports.push(this_npc(&tokio));
    }
    reports.extend(providers.into_iter().map(|((kind, acp), provider)| {
        if acp {
            return acp_program(kind, provider);
        }
        let mut report = installed(kind, provider, &paths.root, &tokio);
        if report.path.is_some() {
            report.checks.extend(agent_files(kind, &plans));
            report.checks.extend(trust(
                kind,
                provider,
                &manifest,
                &paths.root,
                home.as_deref(),
            ));
            report.checks.push(login(kind, provider, home.as_deref()));
        }
        report
    }));
    reports.extend(mcp_servers(&manifest, &paths.root));
    let failed = reports
        .iter()
        .any(|r| r.checks.iter().any(|c| c.status == Status::Problem));
    match args.format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(&reports)?)?,
        Format::Human => print_human(&reports)?,
    }
    if reports.is_empty() {
        errln!("no `[providers.*]` in the manifest: nothing to check");
    }
    let namespaces = std::env::current_exe()
        .map_err(|e| format!("cannot find the `npc` binary: {e}"))
        .and_then(|exe| crate::supervisor::probe_pid_namespaces(&exe));
    if let Err(why) = namespaces {
        errln!(
            "warning: children cannot run in PID namespaces ({why}); what a child moves out of its process group (`setsid`, a daemonizing tool) is stopped with it only by the process group and the watchdog, not when it leaves the group"
        );
    }
    let support = super::validate::sandbox_support();
    match &support {
        Ok(()) if !matches!(args.format, Format::Human) => {}
        Ok(()) => outln!(
            "sandbox: available (Landlock, user, PID and network namespaces); unattended runs get `workspace` unless a `sandbox` setting says otherwise"
        )?,
        Err(why) => errln!(
            "warning: runs cannot be sandboxed here ({why}); unattended runs run without a sandbox, and a run whose manifest asks for one refuses to start"
        ),
    }
    if matches!(args.format, Format::Human) {
        for line in crate::runs::sandbox::describe(&manifest, &support) {
            outln!("  {}", crate::stdx::term::printable(&line))?;
        }
    }
    Ok(if failed { Exit::Failed } else { Exit::Ok })
}

fn print_human(reports: &[Report]) -> anyhow::Result<()> {
    for r in reports {
        // Program names, paths, hook keys and file errors come from the
        // repository: shown with their control characters escaped.
        let show = crate::stdx::term::printable;
        let version = r.version.as_deref().unwrap_or("version unknown");
        let program = show(&r.program);
        match (&r.server, &r.path) {
            (Some(name), _) => outln!("mcp server {} (`{program}`)", show(name))?,
            (None, Some(_)) => outln!("{} (`{program}` {})", r.kind, show(version))?,
            (None, None) => outln!("{} (`{program}`)", r.kind)?,
        }
        for c in &r.checks {
            let mark = match c.status {
                Status::Ok => "ok",
                Status::Warn => "warning",
                Status::Problem => "problem",
            };
            outln!("  {mark}: {}: {}", c.check, show(&c.detail))?;
            if let Some(fix) = &c.fix {
                outln!("    fix: {}", show(fix))?;
            }
        }
    }
    Ok(())
}

/// The npm package each CLI installs from.
fn package(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::ClaudeCode => "@anthropic-ai/claude-code",
        ProviderKind::Codex => "@openai/codex",
        ProviderKind::GeminiCli => "@google/gemini-cli",
        ProviderKind::Opencode => "opencode-ai",
    }
}

/// A bare `program` name found on `PATH` (a path is never looked up: see
/// [`installed`]).
fn find_program(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let path = std::env::var_os("PATH")?;
    // A relative entry (`.`, `bin`) would find the repository's own
    // program: never looked in.
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|p| runnable(p))
}

/// The program the agent files npc writes call (`npc mcp serve`, `npc hook
/// run`), found on `PATH` like the CLIs find it, against this npc.
fn this_npc(tokio: &tokio::runtime::Runtime) -> Report {
    let this = std::env::current_exe().ok();
    let this_real = this.as_deref().and_then(|p| p.canonicalize().ok());
    let found = find_program(NPC_PROGRAM);
    let mut report = Report {
        kind: NPC_PROGRAM,
        server: None,
        program: NPC_PROGRAM.to_string(),
        path: found.clone(),
        version: Some(env!("CARGO_PKG_VERSION").to_string()),
        fixtures: None,
        checks: Vec::new(),
    };
    let shown = this
        .as_deref()
        .map_or_else(|| "this npc".to_string(), |p| format!("`{}`", p.display()));
    let link_fix = format!(
        "put this npc first on `PATH` (e.g. `ln -sf {} ~/.local/bin/npc`)",
        this.as_deref()
            .map_or_else(|| "PATH-TO-NPC".to_string(), |p| p.display().to_string())
    );
    let check = match found {
        None => Check::bad(
            "on_path",
            Status::Problem,
            "no `npc` on `PATH`: the agent CLIs cannot start npc's gateway (`npc mcp serve`), and every tool call a hook bridge governs is denied".to_string(),
            link_fix,
        ),
        Some(path) if path.canonicalize().ok() == this_real => {
            Check::ok("on_path", format!("`{}` is this npc", path.display()))
        }
        Some(path) => {
            let theirs = tokio.block_on(version_of(&path, Path::new("/")));
            let ours = semver::Version::parse(env!("CARGO_PKG_VERSION")).ok();
            if theirs.is_some() && theirs == ours {
                Check::bad(
                    "on_path",
                    Status::Warn,
                    format!(
                        "the agent files call `{}`, another npc binary of this version, not {shown}",
                        path.display()
                    ),
                    link_fix,
                )
            } else {
                Check::bad(
                    "on_path",
                    Status::Problem,
                    format!(
                        "the agent files call `{}` ({}), not {shown} ({})",
                        path.display(),
                        theirs.map_or_else(|| "version unknown".to_string(), |v| v.to_string()),
                        env!("CARGO_PKG_VERSION")
                    ),
                    link_fix,
                )
            }
        }
    };
    report.checks.push(check);
    report
}

/// Whether `kind`'s CLI has credentials, as far as npc can tell without
/// running it: a key in the environment or the provider's `env`, or the
/// file its own login writes. A warning, never a problem: a model gateway
/// may take other credentials.
fn login(kind: ProviderKind, provider: &Provider, home: Option<&Path>) -> Check {
    let in_env = |names: &[&str]| {
        names
            .iter()
            .find(|n| {
                std::env::var_os(n).is_some_and(|v| !v.is_empty()) || provider.env.contains_key(**n)
            })
            .map(|n| format!("`{n}` is set"))
    };
    let file = |p: Option<PathBuf>| {
        p.filter(|p| p.is_file())
            .map(|p| format!("`{}` holds its login", p.display()))
    };
    let data_home = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".local/share")));
    let codex_home = std::env::var_os("CODEX_HOME")
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".codex")));
    let (found, how) = match kind {
        ProviderKind::ClaudeCode => (
            in_env(&[
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_AUTH_TOKEN",
                "CLAUDE_CODE_OAUTH_TOKEN",
                "CLAUDE_CODE_USE_BEDROCK",
                "CLAUDE_CODE_USE_VERTEX",
            ])
            .or_else(|| file(home.map(|h| h.join(".claude/.credentials.json")))),
            "run `claude` once and `/login`, or set `ANTHROPIC_API_KEY` in the provider's `env`",
        ),
        ProviderKind::Codex => (
            in_env(&["OPENAI_API_KEY", "CODEX_API_KEY"])
                .or_else(|| file(codex_home.map(|h| h.join("auth.json")))),
            "run `codex login`, or set `OPENAI_API_KEY` in the provider's `env`",
        ),
        ProviderKind::GeminiCli => (
            in_env(&[
                "GEMINI_API_KEY",
                "GOOGLE_API_KEY",
                "GOOGLE_GENAI_USE_VERTEXAI",
                "GOOGLE_APPLICATION_CREDENTIALS",
            ])
            .or_else(|| file(home.map(|h| h.join(".gemini/oauth_creds.json")))),
            "run `gemini` once and sign in, or set `GEMINI_API_KEY` in the provider's `env`",
        ),
        ProviderKind::Opencode => (
            file(data_home.map(|d| d.join("opencode/auth.json")))
                .or_else(|| in_env(&["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENCODE_API_KEY"])),
            "run `opencode auth login`, or set the model provider's key in the provider's `env`",
        ),
    };
    match found {
        Some(detail) => Check::ok("login", detail),
        None => Check::bad(
            "login",
            Status::Warn,
            "no login npc can see (no key in the environment, no credentials file of the CLI's own login)".to_string(),
            how.to_string(),
        ),
    }
}

/// Each stdio MCP server's command: on `PATH` (a bare name) or in the
/// repository (a path), never run.
fn mcp_servers(manifest: &Manifest, root: &Path) -> Vec<Report> {
    use std::os::unix::fs::PermissionsExt;
    manifest
        .mcp_servers
        .iter()
        .filter(|(_, s)| s.enabled)
        .filter_map(|(name, server)| {
            let crate::model::McpTransport::Stdio(spec) = &server.transport else {
                return None;
            };
            let program = spec.command.clone();
            let path = if program.contains('/') {
                // Looked up through the guarded layer: a path (or a link)
                // leaving the repository is never looked at.
                crate::repofs::Root::new(root)
                    .and_then(|r| r.real_path(Path::new(&program)))
                    .ok()
                    .filter(|p| {
                        std::fs::metadata(p)
                            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                    })
            } else {
                find_program(&program)
            };
            let outside = Path::new(&program).is_absolute()
                || Path::new(&program)
                    .components()
                    .any(|c| c == std::path::Component::ParentDir);
            let check = match &path {
                Some(p) => Check::ok("command", p.display().to_string()),
                None if outside => Check::bad(
                    "command",
                    Status::Warn,
                    format!(
                        "`{program}` is a path outside the repository; npc doctor looks at no file outside it because a manifest says so, so it is not checked"
                    ),
                    format!("check that `{program}` exists yourself"),
                ),
                None => Check::bad(
                    "command",
                    Status::Problem,
                    format!(
                        "`{program}` is not {}: the server cannot start",
                        if program.contains('/') {
                            "an executable file of the repository"
                        } else {
                            "on `PATH`"
                        }
                    ),
                    format!("install `{program}`, or change `mcp.servers.{name}.command`"),
                ),
            };
            Some(Report {
                kind: "mcp_server",
                server: Some(name.clone()),
                program,
                path,
                version: None,
                fixtures: None,
                checks: vec![check],
            })
        })
        .collect()
}

/// The warning for a program the manifest names by path: a repository's
/// choice of program, which `npc doctor` never runs (a fresh clone's code).
fn unchecked_path(check: &'static str, program: &str, fix: String) -> Check {
    Check::bad(
        check,
        Status::Warn,
        format!(
            "`{program}` is a path the manifest names; npc doctor runs no program a repository chose, so it is not checked"
        ),
        fix,
    )
}

/// Whether the ACP program of a `driver = "acp"` provider of `kind` is
/// installed (found on `PATH`; it is not run: an ACP program waits for a
/// client on its stdin).
fn acp_program(kind: ProviderKind, provider: &Provider) -> Report {
    let program = provider.command.clone();
    let mut report = Report {
        kind: kind.as_str(),
        server: None,
        program: program.clone(),
        path: None,
        version: None,
        fixtures: None,
        checks: Vec::new(),
    };
    if program.contains('/') {
        report.checks.push(unchecked_path(
            "acp_program",
            &program,
            "check it yourself if you trust the repository".to_string(),
        ));
        return report;
    }
    report.path = find_program(&program);
    let install = match kind {
        ProviderKind::ClaudeCode => {
            "`npm install -g @agentclientprotocol/claude-agent-acp`".to_string()
        }
        ProviderKind::Codex => "`npm install -g @agentclientprotocol/codex-acp`".to_string(),
        _ => format!("`npm install -g {}`", package(kind)),
    };
    report.checks.push(match &report.path {
        Some(path) => Check::ok("acp_program", path.display().to_string()),
        None => Check::bad(
            "acp_program",
            Status::Problem,
            format!("`{program}`, the ACP program of `driver = \"acp\"`, is not on `PATH`"),
            install,
        ),
    });
    report
}

/// Whether `kind`'s CLI is installed, and its version against npc's fixtures.
fn installed(
    kind: ProviderKind,
    provider: &Provider,
    root: &Path,
    tokio: &tokio::runtime::Runtime,
) -> Report {
    let program = if provider.command.is_empty() {
        kind.default_command().to_string()
    } else {
        provider.command.clone()
    };
    let fixtures = crate::providers::Parser::embedded(kind)
        .baseline_version()
        .map(str::to_string);
    let mut report = Report {
        kind: kind.as_str(),
        server: None,
        program: program.clone(),
        path: None,
        version: None,
        fixtures: fixtures.clone(),
        checks: Vec::new(),
    };
    // A path is the repository's choice of program: `npc doctor` on a
    // fresh clone must not run the clone's code to ask its version.
    if program.contains('/') {
        report.checks.push(unchecked_path(
            "installed",
            &program,
            format!("run `{program} --version` yourself if you trust the repository"),
        ));
        return report;
    }
    report.path = find_program(&program);
    let Some(path) = report.path.clone() else {
        report.checks.push(Check::bad(
            "installed",
            Status::Problem,
            format!("`{program}` is not on `PATH`"),
            format!("`npm install -g {}`", package(kind)),
        ));
        return report;
    };
    report
        .checks
        .push(Check::ok("installed", path.display().to_string()));
    let version = tokio.block_on(version_of(&path, root));
    report.version = version.as_ref().map(ToString::to_string);
    let pin = |v: &str| format!("`npm install -g {}@{v}`", package(kind));
    let check = match (
        version,
        fixtures
            .as_deref()
            .and_then(|f| semver::Version::parse(f).ok()),
    ) {
        (None, _) => Check::bad(
            "version",
            Status::Warn,
            format!("`{program} --version` printed no version"),
            format!("check that `{program} --version` runs"),
        ),
        (Some(v), None) => Check::ok(
            "version",
            format!("{v} (npc has no recorded streams of it)"),
        ),
        (Some(v), Some(f)) if v == f => {
            Check::ok("version", format!("{v}, as npc's recorded streams"))
        }
        (Some(v), Some(f)) => Check::bad(
            "version",
            Status::Warn,
            format!(
                "{v}; npc's parser was recorded with {f}, so `npc run` may meet output it reports as `unknown_event`"
            ),
            format!("if it does, {}", pin(&f.to_string())),
        ),
    };
    report.checks.push(check);
    report
}

/// The version a CLI prints, through the supervisor.
async fn version_of(path: &Path, root: &Path) -> Option<semver::Version> {
    let (events, _receiver) = tokio::sync::mpsc::unbounded_channel();
    let supervisor =
        crate::supervisor::Supervisor::new(events, crate::supervisor::BackoffPolicy::default());
    let spec = crate::supervisor::ChildSpec::new(path.to_string_lossy().into_owned(), root)
        .args(["--version".to_string()]);
    let out = supervisor
        .run_once(&spec, None, VERSION_TIMEOUT, Default::default())
        .await
        .ok()?;
    checks::version_in(&String::from_utf8_lossy(&out.stdout))
}

/// The agent files of the repository as `npc plan` sees them.
fn agent_file_plans(manifest: &Manifest, paths: &RepoPaths) -> Vec<runtime::files::FilePlan> {
    let store = runtime::open_existing_store(paths).ok().flatten();
    runtime::files::plan_files(
        manifest,
        paths,
        store.as_ref(),
        &crate::native::Scope::Project,
    )
}

/// Whether `kind`'s agent files are what `npc apply` would write.
fn agent_files(kind: ProviderKind, plans: &[runtime::files::FilePlan]) -> Vec<Check> {
    let mine: Vec<_> = plans
        .iter()
        .filter(|p| p.what.starts_with(kind.as_str()))
        .collect();
    let stale: Vec<String> = mine
        .iter()
        .filter(|p| p.is_change() || p.error.is_some())
        .map(|p| match &p.error {
            Some(e) => format!("`{}`: {e}", p.path),
            None => format!("`{}` ({})", p.path, p.action),
        })
        .collect();
    if stale.is_empty() {
        let files: Vec<String> = mine.iter().map(|p| format!("`{}`", p.path)).collect();
        return vec![Check::ok(
            "agent_files",
            format!("in step: {}", files.join(", ")),
        )];
    }
    vec![Check::bad(
        "agent_files",
        Status::Problem,
        format!("not in step with the manifest: {}", stale.join(", ")),
        "`npc apply`".to_string(),
    )]
}

/// Whether Gemini CLI offers npc's project agents: each file's text must be
/// acknowledged in the user's `acknowledgments/agents.json` (under `dir`,
/// the user's `.gemini`), which its start-up dialog writes.
fn gemini_agents(manifest: &Manifest, root: &Path, dir: Option<&Path>) -> Vec<Check> {
    let (folder, format) = crate::native::agents::agents_dir(ProviderKind::GeminiCli);
    let agents: Vec<(String, String)> = manifest
        .profiles
        .iter()
        .filter(|(_, p)| {
            manifest
                .providers
                .get(&p.provider)
                .is_some_and(|v| v.kind == ProviderKind::GeminiCli)
        })
        .filter_map(|(name, _)| {
            let path = root
                .join(folder)
                .join(format!("{name}.{}", format.extension()));
            let text = crate::native::read_existing_in(root, &path)
                .ok()
                .flatten()?;
            Some((name.clone(), text))
        })
        .collect();
    if agents.is_empty() {
        return Vec::new();
    }
    let acks_path = dir.map(|d| d.join(GEMINI_AGENT_ACKS));
    let acks = acks_path
        .as_deref()
        .and_then(|p| crate::native::read_existing(p).ok().flatten());
    let missing = checks::gemini_unacknowledged_agents(acks.as_deref(), root, &agents);
    if missing.is_empty() {
        return vec![Check::ok(
            "agent_acknowledgement",
            "npc's agents are acknowledged".to_string(),
        )];
    }
    let shown = acks_path.map_or(format!("~/.gemini/{GEMINI_AGENT_ACKS}"), |p| {
        p.display().to_string()
    });
    vec![Check::bad(
        "agent_acknowledgement",
        Status::Problem,
        format!(
            "Gemini CLI offers a project agent only once its text is acknowledged, and {} {} not",
            missing
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", "),
            if missing.len() == 1 { "is" } else { "are" }
        ),
        format!(
            "start `gemini` in `{}` and accept the new agents it lists (it stores their hashes in `{shown}`)",
            root.display()
        ),
    )]
}

/// Whether the CLI trusts the repository enough to read npc's files.
fn trust(
    kind: ProviderKind,
    provider: &Provider,
    manifest: &Manifest,
    root: &Path,
    home: Option<&Path>,
) -> Vec<Check> {
    let has_arg = |flag: &str| provider.args.iter().any(|a| a.expose() == flag);
    let read = |p: &Path| crate::native::read_existing(p).ok().flatten();
    let root_text = root.display();
    match kind {
        ProviderKind::Codex => {
            let codex_home = std::env::var_os("CODEX_HOME")
                .map(PathBuf::from)
                .or_else(|| home.map(|h| h.join(".codex")));
            let config_path = codex_home.map(|h| h.join("config.toml"));
            let config = config_path.as_deref().and_then(read);
            let shown = config_path
                .as_deref()
                .map_or("~/.codex/config.toml".to_string(), |p| {
                    p.display().to_string()
                });
            let mut out = vec![if checks::codex_trusts(config.as_deref(), root) {
                Check::ok("project_trust", format!("`{root_text}` is trusted"))
            } else {
                Check::bad(
                    "project_trust",
                    Status::Problem,
                    format!(
                        "`{root_text}` is not a trusted project: Codex ignores its `.codex/config.toml` and `.codex/hooks.json`"
                    ),
                    format!(
                        "start `codex` in `{root_text}` once and trust it, or add `[projects.\"{root_text}\"]` with `trust_level = \"trusted\"` to `{shown}`"
                    ),
                )
            }];
            let hooks_path = root.join(".codex/hooks.json");
            let hooks = crate::native::read_existing_in(root, &hooks_path)
                .ok()
                .flatten();
            if let Some(hooks) = hooks {
                let unreviewed =
                    checks::codex_unreviewed_hooks(config.as_deref(), &hooks_path, &hooks);
                out.push(if has_arg(CODEX_BYPASS_HOOK_TRUST) {
                    Check::ok("hook_trust", format!("bypassed by `{CODEX_BYPASS_HOOK_TRUST}` in the provider's `args`"))
                } else if unreviewed.is_empty() {
                    Check::ok("hook_trust", "npc's hooks are reviewed".to_string())
                } else {
                    Check::bad(
                        "hook_trust",
                        Status::Problem,
                        format!(
                            "Codex has no stored review of npc's hooks {}, so it does not run them",
                            unreviewed.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
                        ),
                        format!(
                            "start `codex` in `{root_text}` and review them in `/hooks` (it stores `hooks.state` hashes in `{shown}`)"
                        ),
                    )
                });
            }
            out
        }
        ProviderKind::GeminiCli => {
            if has_arg(GEMINI_SKIP_TRUST)
                || provider
                    .env
                    .get(GEMINI_TRUST_ENV)
                    .is_some_and(|v| v.expose() == "true")
            {
                return vec![Check::ok(
                    "folder_trust",
                    "trusted for each run by the provider's settings".to_string(),
                )];
            }
            let dir = home.map(|h| h.join(".gemini"));
            let folders_path = std::env::var_os("GEMINI_CLI_TRUSTED_FOLDERS_PATH")
                .map(PathBuf::from)
                .or_else(|| dir.as_ref().map(|d| d.join("trustedFolders.json")));
            let settings = dir.as_ref().and_then(|d| read(&d.join("settings.json")));
            let folders = folders_path.as_deref().and_then(read);
            let shown = folders_path
                .as_deref()
                .map_or("~/.gemini/trustedFolders.json".to_string(), |p| {
                    p.display().to_string()
                });
            let mut out = vec![match checks::gemini_trust(
                settings.as_deref(),
                folders.as_deref(),
                root,
            ) {
                GeminiTrust::CheckOff => Check::ok(
                    "folder_trust",
                    "folder trust is off in the user's settings".to_string(),
                ),
                GeminiTrust::Trusted => {
                    Check::ok("folder_trust", format!("`{root_text}` is trusted"))
                }
                trust => Check::bad(
                    "folder_trust",
                    Status::Problem,
                    format!(
                        "`{root_text}` is {}: Gemini CLI ignores its `.gemini/settings.json` and, headless, does not start",
                        if trust == GeminiTrust::Untrusted {
                            "marked untrusted"
                        } else {
                            "not a trusted folder"
                        }
                    ),
                    format!(
                        "start `gemini` in `{root_text}` once and trust it, or add `\"{root_text}\": \"TRUST_FOLDER\"` to `{shown}`"
                    ),
                ),
            }];
            out.extend(gemini_agents(manifest, root, dir.as_deref()));
            out
        }
        ProviderKind::ClaudeCode => {
            let config_dir = provider
                .env
                .get("CLAUDE_CONFIG_DIR")
                .map(|v| std::ffi::OsString::from(v.expose()))
                .or_else(|| std::env::var_os("CLAUDE_CONFIG_DIR"));
            let path = crate::runs::trust::claude_config_path(config_dir.as_deref(), home);
            let config = path.as_deref().and_then(read);
            let shown = path
                .as_deref()
                .map_or("~/.claude.json".to_string(), |p| p.display().to_string());
            vec![
                if crate::runs::trust::claude_project_trusted(config.as_deref(), root) {
                    Check::ok("workspace_trust", format!("`{root_text}` is trusted"))
                } else {
                    Check::bad(
                        "workspace_trust",
                        Status::Problem,
                        format!(
                            "`{root_text}` is not a trusted workspace: Claude Code ignores its `.claude/settings.json` (the permissions and hooks npc writes) and, through the repository, in its worktrees"
                        ),
                        format!(
                            "start `claude` in `{root_text}` once and accept its trust dialog, or set `projects[\"{root_text}\"].{}` to `true` in `{shown}`",
                            crate::runs::trust::CLAUDE_TRUST_KEY
                        ),
                    )
                },
            ]
        }
        ProviderKind::Opencode => vec![Check::ok(
            "workspace_trust",
            "OpenCode has no workspace trust: it reads the project's files anywhere".to_string(),
        )],
    }
}
