//! A run's sandbox: which mode a run gets ([`decide`]: the trigger's
//! `sandbox`, else the profile's, else `[runs]`'s; when none says, `workspace`
//! for runs the daemon starts unattended where the kernel can, `off` for
//! runs started by hand), and what it may touch ([`spec`]): it writes only
//! its worktree (or the checkout in place, npc's state excepted), its own
//! temporary directory, its CLI's state directory and `[runs.sandbox]
//! writable`; it reads everything but the home directory (where only the
//! CLI's state, tool installs and `readable` are), npc's state directory
//! (its own run directory excepted) and other runs' worktrees. A mode asked
//! for explicitly on a machine that cannot provide it refuses the run
//! ([`SandboxRefused`]); the supervisor never starts a sandboxed child
//! without its sandbox.

use std::path::{Path, PathBuf};

use crate::model::diagnostics::grouped_lines;
use crate::model::{HostPattern, Manifest, ProviderKind, SandboxMode, SandboxPath, SandboxRules};
use std::sync::Arc;

use crate::event::Event;
use crate::supervisor::SandboxSpec;

/// npc's fixed runtime directory in the repository (its lock, ledgers,
/// token), whatever `project.state_dir` says.
pub const RUNTIME_DIR: &str = ".npc";
/// The REST API's token file, in the state and runtime directories.
pub const TOKEN_FILE: &str = "api.token";
/// The process-group ledgers, in the runtime directory.
pub const LEDGER_DIR: &str = crate::supervisor::LEDGER_DIR;

/// The run's own temporary directory, in its run directory (`TMPDIR`).
pub const TMP_DIR: &str = "tmp";
/// The egress proxy's unix socket of a `strict` run, in its run directory.
pub const EGRESS_SOCKET: &str = "egress.sock";
/// The loopback port a `strict` run's proxy is reached on inside its
/// network namespace (nothing else listens there).
pub const EGRESS_PORT: u16 = 3128;
/// Paths in the home directory every sandboxed run may read: git's
/// configuration and where CLIs and tools are usually installed.
pub const HOME_READABLE: [&str; 12] = [
    ".gitconfig",
    ".config/git",
    ".local/bin",
    ".local/lib",
    ".npm-global",
    ".nvm",
    ".volta",
    ".bun",
    ".deno",
    ".cargo/bin",
    ".rustup",
    ".local/share/mise",
];

/// Variables naming a CLI's state directory: writable by its runs.
pub const STATE_DIR_ENV: [&str; 2] = ["CLAUDE_CONFIG_DIR", "CODEX_HOME"];

/// The state directories (in the home directory) a CLI writes.
pub fn cli_state_dirs(kind: ProviderKind) -> &'static [&'static str] {
    match kind {
        ProviderKind::ClaudeCode => &[".claude", ".claude.json", ".cache/claude"],
        ProviderKind::Codex => &[".codex"],
        ProviderKind::GeminiCli => &[".gemini"],
        ProviderKind::Opencode => &[
            ".config/opencode",
            ".local/share/opencode",
            ".local/state/opencode",
            ".cache/opencode",
        ],
    }
}

/// A run asked for a sandbox this machine cannot provide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the run asks for `sandbox = \"{}\"` and this machine cannot provide it: {reason}; run `npc doctor`, or set `sandbox = \"off\"` on the run's profile or trigger",
    mode.as_str()
)]
pub struct SandboxRefused {
    pub mode: SandboxMode,
    pub reason: String,
}

/// What a run gets and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub mode: SandboxMode,
    /// Whether a setting asked for it (else it is the default).
    pub explicit: bool,
    /// Why the default is `off` on this machine, if it is.
    pub unsupported: Option<String>,
}

/// The sandbox of a run of `profile` started by `trigger` (`unattended`:
/// the daemon starts it with nobody at a terminal), on a machine whose
/// support is `support`.
pub fn decide(
    manifest: &Manifest,
    profile: Option<&str>,
    trigger: Option<&str>,
    unattended: bool,
    support: &Result<(), String>,
) -> Result<Decision, SandboxRefused> {
    match manifest.sandbox_mode(profile, trigger) {
        Some(SandboxMode::Off) => Ok(Decision {
            mode: SandboxMode::Off,
            explicit: true,
            unsupported: None,
        }),
        Some(mode) => match support {
            Ok(()) => Ok(Decision {
                mode,
                explicit: true,
                unsupported: None,
            }),
            Err(reason) => Err(SandboxRefused {
                mode,
                reason: reason.clone(),
            }),
        },
        None if !unattended => Ok(Decision {
            mode: SandboxMode::Off,
            explicit: false,
            unsupported: None,
        }),
        None => Ok(match support {
            Ok(()) => Decision {
                mode: SandboxMode::Workspace,
                explicit: false,
                unsupported: None,
            },
            Err(reason) => Decision {
                mode: SandboxMode::Off,
                explicit: false,
                unsupported: Some(reason.clone()),
            },
        }),
    }
}

/// Where a run lives, for its [`spec`]: absolute paths.
#[derive(Debug, Clone)]
pub struct Places<'a> {
    pub repo: &'a Path,
    pub state_dir: &'a Path,
    pub worktrees: &'a Path,
    /// The run's own directory (its MCP configuration, its `tmp`).
    pub run_dir: &'a Path,
    /// Where the agent works: its worktree, or the checkout.
    pub cwd: &'a Path,
    pub home: Option<&'a Path>,
    /// The agent CLI (`None` for `setup` and `after` commands).
    pub kind: Option<ProviderKind>,
    /// The CLI's state directories its variables name ([`STATE_DIR_ENV`]).
    pub named_state: &'a [PathBuf],
}

/// `path` made absolute and free of links where it exists.
fn real(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A `[runs.sandbox]` path of a run at `places`.
fn resolve(path: &SandboxPath, places: &Places) -> Option<PathBuf> {
    Some(real(&match path {
        SandboxPath::Home(rel) => places.home?.join(rel),
        SandboxPath::Repository(rel) => places.repo.join(rel),
        SandboxPath::Absolute(abs) => PathBuf::from(abs),
    }))
}

/// What a run of `mode` at `places` may touch; `None` for `off`.
pub fn spec(mode: SandboxMode, rules: &SandboxRules, places: &Places) -> Option<SandboxSpec> {
    if mode == SandboxMode::Off {
        return None;
    }
    let state = real(places.state_dir);
    let runtime = real(&places.repo.join(RUNTIME_DIR));
    // npc's secrets and what other runs own are hidden; the rest of its
    // state is read-only (the run's own `npc hook run` and `npc mcp serve`
    // write through the daemon, `runs::channel`).
    let mut hidden = vec![
        state.join(TOKEN_FILE),
        runtime.join(TOKEN_FILE),
        runtime.join(LEDGER_DIR),
        state.join(super::RUNS_DIR),
        real(places.worktrees),
    ];
    // The store holds every run's events and answers: the agent reads what
    // it may through the gateway's tools, which the daemon serves.
    for dir in [&state, &runtime] {
        let db = crate::store::DB_FILE_NAME;
        for name in std::iter::once(db.to_string()).chain(
            crate::store::DB_SIDE_SUFFIXES
                .iter()
                .map(|s| format!("{db}{s}")),
        ) {
            let path = dir.join(name);
            if !hidden.contains(&path) {
                hidden.push(path);
            }
        }
    }
    let mut read = vec![real(places.repo), real(places.run_dir)];
    let cwd = real(places.cwd);
    let in_place = hidden.iter().any(|h| h.starts_with(&cwd));
    let mut read_only = vec![state];
    if !read_only.contains(&runtime) {
        read_only.push(runtime);
    }
    let run_tmp = real(&places.run_dir.join(TMP_DIR));
    let mut write = vec![run_tmp.clone()];
    let mut write_new = Vec::new();
    if in_place {
        write_new.push(cwd.clone());
    } else {
        write.push(cwd.clone());
    }
    if let Some(home) = places.home {
        let home = real(home);
        hidden.push(home.clone());
        read.extend(HOME_READABLE.iter().map(|p| home.join(p)));
        if let Some(kind) = places.kind {
            write.extend(cli_state_dirs(kind).iter().map(|p| home.join(p)));
        }
    }
    write.extend(places.named_state.iter().map(|p| real(p)));
    read.extend(rules.readable.iter().filter_map(|p| resolve(p, places)));
    write.extend(rules.writable.iter().filter_map(|p| resolve(p, places)));
    // Nothing but the run's own `tmp` and worktree is writable in npc's
    // state, whatever `writable` or a CLI's variable says.
    write.retain(|w| {
        *w == run_tmp
            || *w == cwd
            || !read_only
                .iter()
                .any(|r| w.starts_with(r) || r.starts_with(w))
    });
    let egress = (mode == SandboxMode::Strict).then(|| crate::supervisor::Egress {
        socket: places.run_dir.join(EGRESS_SOCKET),
        port: EGRESS_PORT,
    });
    Some(SandboxSpec {
        hidden,
        read,
        write,
        write_new,
        read_only,
        egress,
    })
}

/// The environment a sandboxed run adds: its own `TMPDIR`, and for a
/// `strict` run the proxy in every spelling the CLIs and tools read (and
/// no `NO_PROXY`, so nothing goes around it).
pub fn env(spec: &SandboxSpec, run_dir: &Path) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "TMPDIR".to_string(),
            run_dir.join(TMP_DIR).display().to_string(),
        ),
        (
            crate::surfaces::channel::SOCKET_ENV.to_string(),
            run_dir
                .join(crate::surfaces::channel::SOCKET_FILE)
                .display()
                .to_string(),
        ),
    ];
    if let Some(egress) = &spec.egress {
        let url = format!("http://127.0.0.1:{}", egress.port);
        for name in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            env.push((name.to_string(), url.clone()));
        }
        env.push(("NO_PROXY".to_string(), String::new()));
        env.push(("no_proxy".to_string(), String::new()));
    }
    env
}

/// Variables naming a provider's model endpoint (a base URL).
pub const BASE_URL_ENV: [&str; 4] = [
    "ANTHROPIC_BASE_URL",
    "OPENAI_BASE_URL",
    "GOOGLE_GEMINI_BASE_URL",
    "GEMINI_BASE_URL",
];

/// The model endpoints a `strict` run of a `kind` CLI may reach: the
/// provider's own API host, and the host of a base URL its environment
/// `env` names ([`BASE_URL_ENV`]).
pub fn model_endpoints(
    kind: ProviderKind,
    env: &std::collections::BTreeMap<String, String>,
) -> Vec<HostPattern> {
    let defaults: &[&str] = match kind {
        ProviderKind::ClaudeCode => &["api.anthropic.com"],
        ProviderKind::Codex => &["api.openai.com", "chatgpt.com"],
        ProviderKind::GeminiCli => &[
            "generativelanguage.googleapis.com",
            "cloudcode-pa.googleapis.com",
        ],
        ProviderKind::Opencode => &["api.anthropic.com", "api.openai.com"],
    };
    let mut out: Vec<HostPattern> = defaults
        .iter()
        .map(|h| HostPattern {
            host: (*h).to_string(),
            subdomains: false,
            port: Some(443),
        })
        .collect();
    for name in BASE_URL_ENV {
        let Some(url) = env.get(name).and_then(|u| url::Url::parse(u).ok()) else {
            continue;
        };
        if let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) {
            out.push(HostPattern {
                host: host.trim_matches(['[', ']']).to_ascii_lowercase(),
                subdomains: false,
                port: Some(port),
            });
        }
    }
    out
}

/// One line per trigger and profile saying which sandbox its runs get
/// (`npc validate`, `npc doctor`), on a machine whose support is `support`.
pub fn describe(manifest: &Manifest, support: &Result<(), String>) -> Vec<String> {
    let word = |d: Result<Decision, SandboxRefused>| match d {
        Ok(d) if d.explicit => d.mode.as_str().to_string(),
        Ok(Decision {
            unsupported: Some(why),
            ..
        }) => format!("off (the default `workspace` is unavailable: {why})"),
        Ok(d) => format!("{} (default)", d.mode.as_str()),
        Err(refused) => format!(
            "`{}`, which this machine cannot provide ({}): such runs refuse to start",
            refused.mode.as_str(),
            refused.reason
        ),
    };
    // Items that get the same are named on one line: a manifest of a
    // thousand profiles says its default once, not a thousand times.
    let triggers = manifest.triggers.iter().map(|(name, trigger)| {
        let what = match &trigger.action {
            crate::model::Action::RunProfile { profile, .. } => format!(
                "sandbox {}",
                word(decide(manifest, Some(profile), Some(name), true, support))
            ),
            crate::model::Action::RunCommand(_) => "a command, run without a sandbox".to_string(),
            crate::model::Action::StartWorkflow { workflow, .. } => {
                format!("starts workflow `{workflow}`, whose steps have their own")
            }
        };
        (name.as_str(), what)
    });
    let profiles = manifest.profiles.keys().map(|name| {
        let what = format!(
            "sandbox {} unattended, {} by hand",
            word(decide(manifest, Some(name), None, true, support)),
            word(decide(manifest, Some(name), None, false, support))
        );
        (name.as_str(), what)
    });
    let mut lines = grouped_lines("trigger", "triggers", triggers);
    lines.extend(grouped_lines("profile", "profiles", profiles));
    lines
}

/// Where runs are carried out, for [`apply`].
#[derive(Debug)]
pub struct Where<'a> {
    pub repo: &'a Path,
    pub state_dir: &'a Path,
    pub supervisor: &'a crate::supervisor::Supervisor,
}

/// A `strict` run's proxy, ready to serve.
#[derive(Debug)]
pub struct Proxy {
    listener: tokio::net::UnixListener,
    policy: crate::surfaces::egress::EgressPolicy,
}

/// What a sandboxed run is served while it runs: its channel (what its
/// hooks record and ask, `runs::channel`) and a `strict` run's proxy.
#[derive(Debug)]
pub struct Sandboxed {
    channel: crate::surfaces::channel::ChannelListener,
    egress: Option<Proxy>,
}

/// The digest of a sandboxed run's secret, in its run directory: how the
/// daemon tells the run's own `npc mcp serve` from another run's.
pub const SECRET_FILE: &str = "run.secret";
/// Longest [`SECRET_FILE`] read.
const MAX_SECRET_FILE_BYTES: usize = 128;

/// Whether `secret` is the secret of run `run` of the state directory
/// `state_dir` (its [`SECRET_FILE`]).
pub fn secret_is_the_runs(
    state_dir: &Path,
    run: &str,
    secret: &crate::surfaces::channel::RunSecret,
) -> bool {
    if !super::workspace::is_run_id(run) {
        return false;
    }
    let Ok(root) = crate::repofs::Root::new(&super::run_dir(state_dir, run)) else {
        return false;
    };
    root.read_own(Path::new(SECRET_FILE), MAX_SECRET_FILE_BYTES)
        .is_ok_and(|digest| {
            crate::surfaces::tcp::constant_time_eq(&digest, secret.digest().as_bytes())
        })
}

/// The tasks of a run's proxy, stopped when the run ends.
#[derive(Debug)]
pub struct EgressTasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for EgressTasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Give `prepared` (a run of `manifest` in the repository of `at`) its
/// sandbox, or refuse it; its channel (and a `strict` run's proxy) come
/// back ready to [`serve`].
pub fn apply(
    prepared: &mut super::PreparedRun,
    manifest: &Manifest,
    at: &Where,
    trigger: Option<&str>,
    unattended: bool,
) -> Result<Option<Sandboxed>, SandboxRefused> {
    let support = at.supervisor.sandbox_support();
    let decision = decide(
        manifest,
        Some(&prepared.profile),
        trigger,
        unattended,
        &support,
    )?;
    let run_dir = super::run_dir(at.state_dir, &prepared.id);
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let worktrees = super::workspace::worktrees_root(at.repo, at.state_dir, &manifest.runs);
    let cwd = prepared.spec.cwd.clone();
    // A CLI's state directory named by its variable is its own too.
    let named_state: Vec<std::path::PathBuf> = STATE_DIR_ENV
        .iter()
        .filter_map(|k| prepared.spec.env.get(*k).map(std::path::PathBuf::from))
        .collect();
    let places = Places {
        named_state: &named_state,
        repo: at.repo,
        state_dir: at.state_dir,
        worktrees: &worktrees,
        run_dir: &run_dir,
        cwd: &cwd,
        home: home.as_deref(),
        kind: Some(prepared.kind),
    };
    let Some(spec) = spec(decision.mode, &manifest.runs.sandbox_rules, &places) else {
        return Ok(None);
    };
    let refused = |reason: String| SandboxRefused {
        mode: decision.mode,
        reason,
    };
    let tmp = run_dir.join(TMP_DIR);
    std::fs::create_dir_all(&tmp)
        .map_err(|e| refused(format!("cannot create `{}`: {e}", tmp.display())))?;
    let egress = match &spec.egress {
        None => None,
        Some(e) => {
            let _ = std::fs::remove_file(&e.socket);
            let listener = tokio::net::UnixListener::bind(&e.socket).map_err(|err| {
                refused(format!(
                    "cannot listen on the egress proxy's socket `{}`: {err}",
                    e.socket.display()
                ))
            })?;
            let mut allow = model_endpoints(prepared.kind, &prepared.spec.env);
            allow.extend(manifest.runs.sandbox_rules.allow_hosts.iter().cloned());
            Some(Proxy {
                listener,
                policy: crate::surfaces::egress::EgressPolicy { allow },
            })
        }
    };
    let channel = open_channel(&run_dir, &prepared.id).map_err(refused)?;
    prepared.spec.env.extend(env(&spec, &run_dir));
    prepared.spec.env.insert(
        crate::surfaces::channel::SECRET_ENV.into(),
        channel.1.expose().to_string(),
    );
    prepared.spec.sandbox = Some(spec);
    Ok(Some(Sandboxed {
        channel: channel.0,
        egress,
    }))
}

/// Bind run `id`'s channel in `run_dir` with a fresh secret (its digest in
/// [`SECRET_FILE`]); `Err` says why not.
fn open_channel(
    run_dir: &Path,
    id: &str,
) -> Result<
    (
        crate::surfaces::channel::ChannelListener,
        crate::surfaces::channel::RunSecret,
    ),
    String,
> {
    use crate::surfaces::channel::{self, RunSecret, SOCKET_FILE};
    let secret = RunSecret::generate()
        .ok_or_else(|| "cannot read random numbers for the run's secret".to_string())?;
    let root = crate::repofs::Root::new(run_dir).map_err(|e| e.to_string())?;
    root.write(
        Path::new(SECRET_FILE),
        secret.digest().as_bytes(),
        crate::repofs::WriteOptions::PRIVATE,
    )
    .map_err(|e| e.to_string())?;
    let socket = Path::new(SOCKET_FILE);
    let path = root.prepare_socket(socket).map_err(|e| e.to_string())?;
    let listener = channel::bind(&path, id, secret.clone()).map_err(|e| {
        format!(
            "cannot listen on the run's channel `{}`: {e}",
            path.display()
        )
    })?;
    root.socket_private(socket).map_err(|e| e.to_string())?;
    Ok((listener, secret))
}

/// Serve a sandboxed run's channel (its hooks' records and asks, parked
/// in `bus`'s store for a person `reach` says can answer) and a `strict`
/// run's egress proxy (each connection and refusal recorded); the
/// returned receiver says why when the proxy stops, which ends the run.
pub fn serve(
    sandboxed: Sandboxed,
    bus: &crate::bus::EventBus,
    run: (&str, &str),
    manifest: Arc<Manifest>,
    reach: crate::hooks::park::Reach,
) -> (EgressTasks, Option<tokio::sync::oneshot::Receiver<String>>) {
    let (run_id, profile) = run;
    let handler = super::channel::RunChannel::new(bus, run_id, profile, manifest, reach);
    let channel = tokio::spawn(sandboxed.channel.serve(Arc::new(handler)));
    let Some(egress) = sandboxed.egress else {
        return (EgressTasks(vec![channel]), None);
    };
    let (mut tasks, died) = serve_egress(egress, bus, run_id, profile);
    tasks.0.push(channel);
    (tasks, Some(died))
}

/// Serve a `strict` run's egress proxy: each connection and refusal
/// recorded; the returned receiver says why when the proxy stops.
fn serve_egress(
    egress: Proxy,
    bus: &crate::bus::EventBus,
    run_id: &str,
    profile: &str,
) -> (EgressTasks, tokio::sync::oneshot::Receiver<String>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (died_tx, died_rx) = tokio::sync::oneshot::channel();
    let policy = Arc::new(egress.policy);
    let proxy = tokio::spawn(async move {
        let e = crate::surfaces::egress::serve(egress.listener, policy, tx).await;
        let _ = died_tx.send(format!("the run's egress proxy stopped: {e}"));
    });
    let bus = bus.clone();
    let (id, profile) = (run_id.to_string(), profile.to_string());
    let recorder = tokio::spawn(async move {
        let record = |event: Event| {
            let bus = bus.clone();
            let event = event.for_component(super::component(&id));
            async move {
                if let Err(e) = bus.publish(event).await {
                    tracing::warn!("cannot record a run's egress: {e}");
                }
            }
        };
        while let Some(r) = rx.recv().await {
            record(crate::event::Event::RunEgress(crate::event::RunEgress {
                run_id: id.clone(),
                host: r.host.clone(),
                port: r.port,
                method: r.method.clone(),
                allowed: r.allowed,
                reason: r.reason.clone(),
            }))
            .await;
            if !r.allowed {
                record(crate::event::Event::ToolDenied(crate::event::ToolDenied {
                    run_id: Some(id.clone()),
                    profile: Some(profile.clone()),
                    tool: format!("network {}:{}", r.host, r.port),
                    rule: "[runs.sandbox] allow_hosts".into(),
                    by: crate::event::DeniedBy::Sandbox,
                    reason: r.reason,
                }))
                .await;
            }
        }
    });
    (EgressTasks(vec![proxy, recorder]), died_rx)
}

/// The sandbox of a worktree run's `setup` and `after` commands in `dir`:
/// the run's mode, its files (no CLI state directory); a `strict` run's
/// commands have no network at all (its proxy serves the agent only).
pub fn for_commands(
    manifest: &Manifest,
    at: &Where,
    run: (&str, Option<&str>, Option<&str>),
    unattended: bool,
    dir: &Path,
) -> Result<Option<SandboxSpec>, SandboxRefused> {
    let (id, profile, trigger) = run;
    let decision = decide(
        manifest,
        profile,
        trigger,
        unattended,
        &at.supervisor.sandbox_support(),
    )?;
    let run_dir = super::run_dir(at.state_dir, id);
    let worktrees = super::workspace::worktrees_root(at.repo, at.state_dir, &manifest.runs);
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let places = Places {
        repo: at.repo,
        state_dir: at.state_dir,
        worktrees: &worktrees,
        run_dir: &run_dir,
        cwd: dir,
        home: home.as_deref(),
        kind: None,
        named_state: &[],
    };
    let spec = spec(decision.mode, &manifest.runs.sandbox_rules, &places);
    if spec.is_some() {
        let tmp = run_dir.join(TMP_DIR);
        std::fs::create_dir_all(&tmp).map_err(|e| SandboxRefused {
            mode: decision.mode,
            reason: format!("cannot create `{}`: {e}", tmp.display()),
        })?;
    }
    Ok(spec)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `text` loaded as a valid manifest.
    pub(crate) fn manifest(text: &str) -> Manifest {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("npcagent.toml");
        std::fs::write(&path, text).unwrap();
        crate::plugins::files::load_path(&path, &crate::disk::ProcessEnv)
            .unwrap()
            .manifest
            .expect("valid manifest")
    }

    const BASE: &str = "version = 1\n[providers.c]\nkind = \"claude_code\"\n[profiles.p]\nprovider = \"c\"\ndescription = \"d\"\n";

    #[test]
    fn the_default_is_workspace_unattended_where_supported_and_an_explicit_mode_is_never_skipped() {
        let m = manifest(BASE);
        let yes: Result<(), String> = Ok(());
        let no: Result<(), String> = Err("no Landlock".into());
        let d = decide(&m, Some("p"), None, true, &yes).unwrap();
        assert_eq!((d.mode, d.explicit), (SandboxMode::Workspace, false));
        let d = decide(&m, Some("p"), None, false, &yes).unwrap();
        assert_eq!(d.mode, SandboxMode::Off);
        let d = decide(&m, Some("p"), None, true, &no).unwrap();
        assert_eq!(
            (d.mode, d.unsupported.as_deref()),
            (SandboxMode::Off, Some("no Landlock"))
        );
        let strict = manifest(&format!("{BASE}sandbox = \"strict\"\n"));
        let refused = decide(&strict, Some("p"), None, false, &no).unwrap_err();
        assert_eq!(refused.mode, SandboxMode::Strict);
        assert!(refused.to_string().contains("no Landlock"), "{refused}");
        let off = manifest(&format!("{BASE}sandbox = \"off\"\n"));
        assert_eq!(
            decide(&off, Some("p"), None, true, &no).unwrap().mode,
            SandboxMode::Off
        );
    }

    #[test]
    fn a_spec_hides_home_secrets_and_other_runs_and_writes_only_the_runs_own_places() {
        let rules = SandboxRules::default();
        let places = Places {
            repo: Path::new("/r"),
            state_dir: Path::new("/r/.npc"),
            worktrees: Path::new("/r/.npc/worktrees"),
            run_dir: Path::new("/r/.npc/runs/1"),
            cwd: Path::new("/r/.npc/worktrees/1"),
            home: Some(Path::new("/h")),
            kind: Some(ProviderKind::Codex),
            named_state: &[],
        };
        assert!(spec(SandboxMode::Off, &rules, &places).is_none());
        let s = spec(SandboxMode::Workspace, &rules, &places).unwrap();
        for hidden in [
            "/h",
            "/r/.npc/state.db",
            "/r/.npc/state.db-wal",
            "/r/.npc/state.db-shm",
            "/r/.npc/api.token",
            "/r/.npc/runs",
            "/r/.npc/worktrees",
        ] {
            assert!(s.hidden.contains(&PathBuf::from(hidden)), "{hidden}: {s:?}");
        }
        assert!(s.write.contains(&PathBuf::from("/h/.codex")));
        assert!(!s.write.iter().any(|w| w.starts_with("/h/.claude")));
        assert!(s.write.contains(&PathBuf::from("/r/.npc/worktrees/1")));
        assert_eq!(s.read_only, vec![PathBuf::from("/r/.npc")]);
        assert!(!s.write.iter().any(|w| w == Path::new("/r/.npc")));
        assert!(s.egress.is_none());
        let strict = spec(SandboxMode::Strict, &rules, &places).unwrap();
        assert_eq!(
            strict.egress.map(|e| e.socket),
            Some(PathBuf::from("/r/.npc/runs/1").join(EGRESS_SOCKET))
        );
    }

    #[test]
    fn nothing_makes_npcs_state_writable_but_the_runs_own_tmp_and_worktree() {
        let rules = SandboxRules {
            writable: vec![
                SandboxPath::Repository(".npc".into()),
                SandboxPath::Repository(".npc/runs".into()),
                SandboxPath::Repository("out".into()),
                SandboxPath::Absolute("/".into()),
            ],
            ..SandboxRules::default()
        };
        let named = [PathBuf::from("/r/.npc/cli-state")];
        let places = Places {
            repo: Path::new("/r"),
            state_dir: Path::new("/r/.npc"),
            worktrees: Path::new("/r/.npc/worktrees"),
            run_dir: Path::new("/r/.npc/runs/1"),
            cwd: Path::new("/r"),
            home: None,
            kind: Some(ProviderKind::Codex),
            named_state: &named,
        };
        let s = spec(SandboxMode::Workspace, &rules, &places).unwrap();
        assert_eq!(s.read_only, vec![PathBuf::from("/r/.npc")]);
        assert_eq!(
            s.write,
            vec![PathBuf::from("/r/.npc/runs/1/tmp"), PathBuf::from("/r/out")]
        );
        // In place: the checkout is written around npc's state.
        assert_eq!(s.write_new, vec![PathBuf::from("/r")]);
    }

    #[test]
    fn model_endpoints_are_the_providers_host_and_its_base_url() {
        let env = [(
            "ANTHROPIC_BASE_URL".to_string(),
            "http://127.0.0.1:4000/v1".to_string(),
        )]
        .into_iter()
        .collect();
        let hosts = model_endpoints(ProviderKind::ClaudeCode, &env);
        assert!(hosts.iter().any(|h| h.admits("api.anthropic.com", 443)));
        assert!(hosts.iter().any(|h| h.admits("127.0.0.1", 4000)));
        assert!(!hosts.iter().any(|h| h.admits("127.0.0.1", 4001)));
    }
}
