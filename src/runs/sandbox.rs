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

use crate::model::{HostPattern, Manifest, ProviderKind, SandboxMode, SandboxPath, SandboxRules};
use crate::supervisor::{Egress, SandboxSpec};

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
    pub kind: ProviderKind,
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
    let mut hidden = vec![real(places.state_dir), real(places.worktrees)];
    let mut read = vec![real(places.repo), real(places.run_dir)];
    let mut write = vec![real(places.cwd), real(&places.run_dir.join(TMP_DIR))];
    if let Some(home) = places.home {
        let home = real(home);
        hidden.push(home.clone());
        read.extend(HOME_READABLE.iter().map(|p| home.join(p)));
        write.extend(cli_state_dirs(places.kind).iter().map(|p| home.join(p)));
    }
    write.extend(places.named_state.iter().map(|p| real(p)));
    read.extend(rules.readable.iter().filter_map(|p| resolve(p, places)));
    write.extend(rules.writable.iter().filter_map(|p| resolve(p, places)));
    let egress = (mode == SandboxMode::Strict).then(|| Egress {
        socket: places.run_dir.join(EGRESS_SOCKET),
        port: EGRESS_PORT,
    });
    Some(SandboxSpec {
        hidden,
        read,
        write,
        egress,
    })
}

/// The environment a sandboxed run adds: its own `TMPDIR`, and for a
/// `strict` run the proxy in every spelling the CLIs and tools read (and
/// no `NO_PROXY`, so nothing goes around it).
pub fn env(spec: &SandboxSpec, run_dir: &Path) -> Vec<(String, String)> {
    let mut env = vec![(
        "TMPDIR".to_string(),
        run_dir.join(TMP_DIR).display().to_string(),
    )];
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
        Err(refused) => format!("refused to start: {refused}"),
    };
    let mut lines = Vec::new();
    for (name, trigger) in &manifest.triggers {
        let profile = match &trigger.action {
            crate::model::Action::RunProfile { profile, .. } => Some(profile.as_str()),
            crate::model::Action::RunCommand(_) => None,
        };
        lines.push(format!(
            "trigger `{name}`: sandbox {}",
            word(decide(manifest, profile, Some(name), true, support))
        ));
    }
    for name in manifest.profiles.keys() {
        lines.push(format!(
            "profile `{name}`: sandbox {} unattended, {} by hand",
            word(decide(manifest, Some(name), None, true, support)),
            word(decide(manifest, Some(name), None, false, support))
        ));
    }
    lines
}
