//! Lowering: [`RawManifest`] → validated [`Manifest`], with every semantic
//! check. Each check pushes a diagnostic and moves on, so one run reports
//! every problem. Files the manifest references (prompt templates, plugin
//! packages) are read through [`Files`], never directly.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Component, Path};

use indexmap::IndexMap;

use super::de::{Entry, Spanned};
use super::diagnostics::quoted_list;
use super::diagnostics::{Diagnostic, clip, did_you_mean, has_room};
use super::package::{PackageContents, PackageView};
use super::raw::*;
use super::schedule::Schedule;
use super::source::{SourceFile, Span};
use super::template;
use super::text::Text;
use super::types::*;

mod agents;
mod hooks;
mod mcp;
mod notify;
mod panes;
mod runs;
mod sandbox;
mod triggers;
mod workflows;

/// Read access to the files a manifest references, relative to the
/// manifest's directory. The loader uses the real file system; tests may
/// use a map.
pub trait Files {
    fn read_to_string(&self, path: &Path) -> std::io::Result<String>;
    fn is_dir(&self, path: &Path) -> bool;
    /// `Ok` when `path` is a directory; else why not (the message reads
    /// after the path).
    fn check_dir(&self, path: &Path) -> std::io::Result<()> {
        if self.is_dir(path) {
            Ok(())
        } else {
            Err(std::io::ErrorKind::NotFound.into())
        }
    }
    /// The Agent Plugins package at directory `dir`, declared as plugin
    /// `entry`: its problems and what it adds, when this file system can
    /// check packages (`plugins::PackageFiles` does).
    fn package(&self, _entry: &str, _dir: &Path) -> Option<PackageView> {
        None
    }
    /// Join the user registry's enabled plugins (`npc plugin install`) to
    /// `manifest`, after its own; a plugin that cannot join is dropped with
    /// a `PluginNotice`, never an error of the manifest. By default there
    /// is no registry.
    fn add_user_plugins(&self, _manifest: &mut Manifest) {}
    /// Whether the manifest's directory is the top of a git working tree
    /// (a worktree run needs one); `None` when this file system cannot say.
    fn is_git_repository(&self) -> Option<bool> {
        None
    }
}

/// An I/O error's message as the tail of a sentence that starts with the
/// path: "`x` does not exist", "`x` permission denied (os error 13)".
fn io_reason(e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound {
        return "does not exist".to_string();
    }
    let text = e.to_string();
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

/// Where a prompt's text without errors is written (to point later
/// diagnostics at it) and the variables it reads.
type Probed = (template::TemplateSource, BTreeSet<String>);
/// A lowered prompt and, when its text has no errors, its [`Probed`].
type Located<T> = (T, Option<Probed>);

/// Largest prompt template file read.
pub const MAX_TEMPLATE_BYTES: usize = 1024 * 1024;

struct Lower<'a> {
    file: &'a SourceFile,
    files: &'a dyn Files,
    diags: Vec<Diagnostic>,
    /// Every entry name per section, including entries that failed to
    /// parse, so a reference to a broken entry is not reported twice.
    names: HashMap<&'static str, BTreeSet<String>>,
    /// Whether deserializing already reported the `version` value (a wrong
    /// type); its placeholder must not be reported again as unsupported.
    version_reported: bool,
    /// Whether any error was found, including ones dropped past the cap.
    errored: bool,
    /// One minijinja environment for every template check of this run.
    templates: Option<minijinja::Environment<'static>>,
    /// What is left of [`template::MANIFEST_PROBE_FUEL`] for this manifest.
    probe_fuel: u64,
    /// Top-level sections spelled wrong (see `de::DeCtx::misspelled`).
    misspelled: &'a BTreeSet<String>,
}

/// Lower and check a raw manifest. Returns the model only when there was no error.
pub fn lower(
    raw: RawManifest,
    file: &SourceFile,
    files: &dyn Files,
    misspelled: &BTreeSet<String>,
    diags: &mut Vec<Diagnostic>,
) -> Option<Manifest> {
    let version_reported = diags.iter().any(|d| {
        d.location
            .as_ref()
            .is_some_and(|l| l.span == raw.version.span)
    });
    let mut l = Lower {
        file,
        files,
        diags: Vec::new(),
        names: HashMap::new(),
        templates: None,
        probe_fuel: template::MANIFEST_PROBE_FUEL,
        version_reported,
        errored: false,
        misspelled,
    };
    let manifest = l.manifest(raw);
    let failed = l.errored || l.diags.iter().any(Diagnostic::is_error);
    diags.append(&mut l.diags);
    if failed || diags.iter().any(Diagnostic::is_error) {
        None
    } else {
        Some(manifest)
    }
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('a'..='z' | '0'..='9'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
}

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Longest single argument or `KEY=VALUE` environment string the OS passes
/// to a program, counting its terminating NUL (Linux `MAX_ARG_STRLEN`, 32
/// pages): a longer one makes the spawn fail with `E2BIG`.
pub const MAX_ARG_STRLEN: usize = 131_072;
/// Most bytes of arguments and environment one program may be given: every
/// string with its NUL plus one pointer each, as the kernel counts them
/// against `ARG_MAX` (2 MiB with the default 8 MiB stack). A quarter is kept
/// free for what npc, the agent CLI and the inherited environment add.
pub const MAX_ARG_LIST_BYTES: usize = 1536 * 1024;
/// What to do about a NUL byte in a value the OS would receive.
const NUL_HINT: &str =
    "remove it; the OS cannot pass a NUL byte inside an argument, an environment value or a path";
/// Bytes of one pointer in `argv` / `envp`, as the kernel counts them.
const ARG_POINTER_BYTES: usize = std::mem::size_of::<usize>();

/// Characters a shell would interpret; never allowed in relaunch flags.
pub const SHELL_METACHARACTERS: &[char] = &[
    '|', '&', ';', '<', '>', '(', ')', '$', '`', '\\', '"', '\'', '*', '?', '[', ']', '#', '~',
    '=', '%', '{', '}', '\n', '\r',
];

impl Lower<'_> {
    fn error(&mut self, span: &Span, summary: impl Into<String>, hint: impl Into<String>) {
        self.errored = true;
        if !has_room(&self.diags) {
            return;
        }
        self.diags.push(
            Diagnostic::error(summary)
                .at(self.file, span.clone())
                .with_hint(hint),
        );
    }

    fn warning(&mut self, span: &Span, summary: impl Into<String>, hint: impl Into<String>) {
        if !has_room(&self.diags) {
            return;
        }
        self.diags.push(
            Diagnostic::warning(summary)
                .at(self.file, span.clone())
                .with_hint(hint),
        );
    }

    /// Check the names of a section's entries and keep the ones that parsed.
    fn entries<T>(
        &mut self,
        section: &'static str,
        map: IndexMap<Spanned<String>, Entry<T>>,
    ) -> Vec<(Spanned<String>, T)> {
        let mut out = Vec::with_capacity(map.len());
        let names = self.names.entry(section).or_default();
        names.extend(map.keys().map(|k| k.value.clone()));
        for (name, entry) in map {
            if !is_name(&name) {
                let suggestion = name.to_ascii_lowercase().replace(
                    |c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '-',
                    "-",
                );
                self.error(
                    &name.span,
                    format!("invalid name `{}` in `{section}`", clip(&name.value)),
                    format!("names are lowercase letters, digits, `_` and `-`, starting with a letter or digit, such as `{}`", clip(suggestion.trim_start_matches(['-', '_']))),
                );
            }
            if let Entry(Some(value)) = entry {
                out.push((name, value));
            }
        }
        out
    }

    fn manifest(&mut self, raw: RawManifest) -> Manifest {
        if *raw.version != 1 && !self.version_reported {
            self.error(
                &raw.version.span,
                format!("unsupported manifest version `{}`", *raw.version),
                "this npc reads `version = 1`",
            );
        }
        let project = self.project(raw.project.and_then(|e| e.0));
        let daemon = self.daemon(raw.daemon.and_then(|e| e.0));
        let runs = self.runs(raw.runs.and_then(|e| e.0));
        let store = self.store(raw.store.and_then(|e| e.0));
        let (mcp, servers, builtins) = match raw.mcp.and_then(|e| e.0) {
            Some(m) => (
                McpSettings {
                    gateway: m.gateway.unwrap_or(false),
                    prefix: self.choice(
                        m.prefix.as_ref(),
                        "mcp.prefix",
                        Prefix::parse,
                        &Prefix::NAMES,
                    ),
                    tools: self.choice(
                        m.tools.as_ref(),
                        "mcp.tools",
                        ToolListing::parse,
                        &ToolListing::NAMES,
                    ),
                },
                m.servers,
                m.builtins.and_then(|e| e.0),
            ),
            None => (McpSettings::default(), Default::default(), None),
        };
        let mcp_builtins = self.mcp_builtins(builtins);
        let mut m = Manifest {
            project,
            daemon,
            runs,
            store,
            mcp,
            mcp_servers: BTreeMap::new(),
            mcp_builtins,
            providers: BTreeMap::new(),
            profiles: BTreeMap::new(),
            prompts: BTreeMap::new(),
            instructions: None,
            hooks: BTreeMap::new(),
            plugins: BTreeMap::new(),
            triggers: BTreeMap::new(),
            pane_plugins: BTreeMap::new(),
            panes: BTreeMap::new(),
            notify: BTreeMap::new(),
            workflows: BTreeMap::new(),
            plugin_notices: Vec::new(),
        };
        for (name, s) in self.entries("mcp.servers", servers) {
            if let Some(server) = self.mcp_server(&name, s) {
                m.mcp_servers.insert(name.value, server);
            }
        }
        for (name, p) in self.entries("providers", raw.providers) {
            if let Some(provider) = self.provider(p) {
                m.providers.insert(name.value, provider);
            }
        }
        let mut located = BTreeMap::new();
        for (name, p) in self.entries("prompts", raw.prompts) {
            if let Some((prompt, at)) = self.prompt(&name, p) {
                if let Some(at) = at {
                    located.insert(name.value.clone(), at);
                }
                m.prompts.insert(name.value, prompt);
            }
        }
        let mut instructions_at = None;
        if let Some((prompt, at)) = raw
            .instructions
            .and_then(|e| e.0)
            .and_then(|i| self.instructions(i))
        {
            m.instructions = Some(prompt);
            instructions_at = at;
        }
        let raw_profiles = self.entries("profiles", raw.profiles);
        let raw_triggers = self.entries("triggers", raw.triggers);
        let raw_panes = self.entries("panes", raw.panes);
        for (name, p) in self.entries("pane_plugins", raw.pane_plugins) {
            if let Some(plugin) = self.pane_plugin(p) {
                m.pane_plugins.insert(name.value, plugin);
            }
        }
        for (name, p) in self.entries("plugins", raw.plugins) {
            if let Some(plugin) = self.plugin(&name, p, &mut m.mcp_servers) {
                m.plugins.insert(name.value, plugin);
            }
        }
        // Then the user registry's, which never make the manifest invalid.
        self.files.add_user_plugins(&mut m);
        // Sections that reference others come after what they reference.
        for (name, p) in raw_profiles {
            if let Some(profile) = self.profile(p) {
                m.profiles.insert(name.value, profile);
            }
        }
        // Workflows before the triggers that start them.
        for (name, w) in self.entries("workflows", raw.workflows) {
            if let Some(workflow) = self.workflow(&name, w) {
                m.workflows.insert(name.value, workflow);
            }
        }
        let mut routes: HashMap<String, Span> = HashMap::new();
        for (name, t) in raw_triggers {
            if let Some(trigger) = self.trigger(t, &m, &mut routes) {
                m.triggers.insert(name.value, trigger);
            }
        }
        for (name, p) in raw_panes {
            if let Some(pane) = self.pane(&name, p, &m) {
                m.panes.insert(name.value, pane);
            }
        }
        for (name, n) in self.entries("notify", raw.notify) {
            if let Some(sink) = self.notify(&name, n) {
                m.notify.insert(name.value, sink);
            }
        }
        for (event, list) in raw.hooks {
            let Some(kind) = HookEvent::parse(&event) else {
                let hint = match HookEvent::other_name(&event).map(HookEvent::as_str) {
                    Some(ours) => format!("npc calls it `{ours}`"),
                    None => match did_you_mean(&event, HookEvent::NAMES) {
                        Some(best) => format!("did you mean `{best}`?"),
                        None => format!("hook events are {}", quoted_list(&HookEvent::NAMES)),
                    },
                };
                self.error(
                    &event.span,
                    format!("unknown hook event `{}`", clip(&event.value)),
                    hint,
                );
                continue;
            };
            let Entry(Some(list)) = list else { continue };
            let hooks: Vec<Hook> = list
                .into_iter()
                .filter_map(|e| e.0)
                .filter_map(|h| self.hook(kind, h))
                .collect();
            m.hooks.insert(kind, hooks);
        }
        self.uses(&m, &located, instructions_at.as_ref());
        m
    }

    /// Probe every prompt in every place it is rendered (as a command, for
    /// each profile and each trigger that names it; `[instructions]` with
    /// nothing but the project and workspace): a value undefined there is
    /// an error now, not when `npc apply` or a run renders it. `located`:
    /// where each prompt without template errors is written.
    fn uses(
        &mut self,
        m: &Manifest,
        located: &BTreeMap<String, Probed>,
        instructions_at: Option<&Probed>,
    ) {
        let mut uses: Vec<(&str, &Prompt, &Probed, template::PromptUse)> = Vec::new();
        let defaults = |p: &Prompt| -> BTreeSet<String> {
            p.variables
                .iter()
                .filter(|(_, v)| v.default.is_some())
                .map(|(k, _)| k.clone())
                .collect()
        };
        // Who renders each prompt, found in one pass over the profiles and
        // one over the triggers (not once per prompt: a manifest of
        // thousands of each stays linear).
        let mut profiles_of: HashMap<&str, Vec<&str>> = HashMap::new();
        for (profile, p) in &m.profiles {
            if let Some(prompt) = p.prompt.as_deref() {
                profiles_of.entry(prompt).or_default().push(profile);
            }
        }
        // A trigger and the variables it gives, per prompt it renders.
        type Given<'m> = (&'m str, &'m BTreeMap<String, Text>);
        let mut triggers_of: HashMap<&str, Vec<Given<'_>>> = HashMap::new();
        for (trigger, t) in &m.triggers {
            let Action::RunProfile {
                profile,
                prompt: chosen,
                vars,
            } = &t.action
            else {
                continue;
            };
            let rendered = match chosen {
                Some(chosen) => Some(chosen.as_str()),
                None => m.profiles.get(profile).and_then(|p| p.prompt.as_deref()),
            };
            if let Some(rendered) = rendered {
                triggers_of
                    .entry(rendered)
                    .or_default()
                    .push((trigger, vars));
            }
        }
        for (name, prompt) in &m.prompts {
            let Some(at) = located.get(name) else {
                continue;
            };
            if prompt.command {
                uses.push((
                    name,
                    prompt,
                    at,
                    template::PromptUse {
                        what: format!("its command `/{name}`"),
                        profile: false,
                        trigger: false,
                        run: false,
                        vars: prompt.variables.keys().cloned().collect(),
                    },
                ));
            }
            for profile in profiles_of.get(name.as_str()).into_iter().flatten() {
                uses.push((
                    name,
                    prompt,
                    at,
                    template::PromptUse {
                        what: format!("profile `{profile}`"),
                        profile: true,
                        trigger: false,
                        run: false,
                        vars: defaults(prompt),
                    },
                ));
            }
            for (trigger, vars) in triggers_of.get(name.as_str()).into_iter().flatten() {
                let mut given = defaults(prompt);
                given.extend(vars.keys().cloned());
                uses.push((
                    name,
                    prompt,
                    at,
                    template::PromptUse {
                        what: format!("trigger `{trigger}`"),
                        profile: true,
                        trigger: true,
                        run: true,
                        vars: given,
                    },
                ));
            }
        }
        if let (Some(prompt), Some(at)) = (&m.instructions, instructions_at) {
            uses.push((
                INSTRUCTIONS_NAME,
                prompt,
                at,
                template::PromptUse {
                    what: "`[instructions]`".to_string(),
                    profile: false,
                    trigger: false,
                    run: false,
                    vars: BTreeSet::new(),
                },
            ));
        }
        // Uses that see the same context render alike: probe one of them
        // (a prompt shared by a hundred profiles is rendered once here).
        let mut probed = BTreeSet::new();
        for (name, prompt, (at, reads), used) in uses {
            if !used.lacks(reads) {
                continue;
            }
            let context = (
                name,
                used.profile,
                used.trigger,
                used.run,
                used.vars.clone(),
            );
            if !probed.insert(context) {
                continue;
            }
            if let Some(d) =
                template::check_use(name, &prompt.template, at, &used, &mut self.probe_fuel)
            {
                self.errored = true;
                if has_room(&self.diags) {
                    self.diags.push(d);
                }
            }
        }
    }

    fn project(&mut self, raw: Option<Spanned<RawProject>>) -> Project {
        let Some(raw) = raw else {
            return Project {
                name: None,
                state_dir: DEFAULT_STATE_DIR.to_string(),
            };
        };
        let state_dir = match raw.value.state_dir {
            Some(dir) => {
                if self.relative_path(&dir.span, &dir.value, "`project.state_dir`")
                    && !below(Path::new(&dir.value))
                {
                    // npc makes its state directory private and git-ignores
                    // everything in it: never the repository itself.
                    self.error(
                        &dir.span,
                        "`project.state_dir` is the manifest's directory itself",
                        "name a directory inside it, such as `.npc`",
                    );
                }
                dir.value
            }
            None => DEFAULT_STATE_DIR.to_string(),
        };
        Project {
            name: raw.value.name.map(|n| n.value),
            state_dir,
        }
    }

    /// A path must be relative and stay inside the repository.
    fn relative_path(&mut self, span: &Span, path: &str, what: &str) -> bool {
        let p = Path::new(path);
        if path.contains('\0') {
            self.error(span, format!("{what} contains a NUL byte"), NUL_HINT);
            false
        } else if path.is_empty() {
            self.error(
                span,
                format!("{what} is empty"),
                "give a path relative to the manifest's directory",
            );
            false
        } else if p.is_absolute() {
            self.error(span, format!("{what} is an absolute path"), "use a path relative to the manifest's directory, so the manifest works in every checkout");
            false
        } else if escapes(p) {
            self.error(
                span,
                format!("{what} leaves the repository"),
                "keep the path inside the manifest's directory (no leading `..`)",
            );
            false
        } else {
            true
        }
    }

    fn env_var_name(&mut self, name: &Spanned<String>, what: &str) -> Option<String> {
        if is_env_name(name) {
            Some(name.value.clone())
        } else {
            self.error(
                &name.span,
                format!(
                    "`{}` is not a valid environment variable name for {what}",
                    name.value
                ),
                "use letters, digits and `_`, not starting with a digit, such as `GITHUB_TOKEN`",
            );
            None
        }
    }

    fn daemon(&mut self, raw: Option<Spanned<RawDaemon>>) -> Daemon {
        let default_listen: SocketAddr = DEFAULT_LISTEN.parse().expect("default address parses");
        let Some(Spanned { value: raw, .. }) = raw else {
            return Daemon {
                listen: default_listen,
                token_env: None,
                auth: Auth::Token,
                allow_remote: false,
                log_level: LogLevel::Info,
                webhook_listen: DEFAULT_WEBHOOK_LISTEN
                    .parse()
                    .expect("default address parses"),
            };
        };
        let token_env = raw
            .token_env
            .as_ref()
            .and_then(|t| self.env_var_name(t, "`daemon.token_env`"));
        let allow_remote = raw.allow_remote.unwrap_or(false);
        let listen = self.listen_address(
            raw.listen.as_ref(),
            "daemon.listen",
            default_listen,
            allow_remote,
            token_env.is_some(),
        );
        let webhook_listen = self.listen_address(
            raw.webhook_listen.as_ref(),
            "daemon.webhook_listen",
            DEFAULT_WEBHOOK_LISTEN
                .parse()
                .expect("default address parses"),
            allow_remote,
            token_env.is_some(),
        );
        let auth = match &raw.auth {
            None => Auth::Token,
            Some(a) => match Auth::parse(a) {
                Some(Auth::None) => {
                    if !listen.ip().is_loopback() {
                        self.error(
                            &a.span,
                            "`daemon.auth = \"none\"` cannot serve a non-loopback `daemon.listen`",
                            "keep `auth = \"token\"` (the default) to listen beyond this machine",
                        );
                    } else {
                        self.warning(
                            &a.span,
                            "`daemon.auth = \"none\"`: any local account and any web page your browser opens can use the API, the dashboard's terminals and `npc mcp serve --http`",
                            "remove `auth` to require the repository's token (the dashboard opens with `npc dashboard`)",
                        );
                    }
                    Auth::None
                }
                Some(auth) => auth,
                None => {
                    let hint = suggest(a, &Auth::NAMES);
                    self.error(
                        &a.span,
                        format!("unknown `daemon.auth` `{}`", clip(&a.value)),
                        hint,
                    );
                    Auth::Token
                }
            },
        };
        let log_level = match &raw.log_level {
            None => LogLevel::Info,
            Some(level) => LogLevel::parse(level).unwrap_or_else(|| {
                let hint = suggest(level, &LogLevel::NAMES);
                self.error(
                    &level.span,
                    format!("unknown log level `{}`", clip(&level.value)),
                    hint,
                );
                LogLevel::Info
            }),
        };
        Daemon {
            listen,
            token_env,
            auth,
            allow_remote,
            log_level,
            webhook_listen,
        }
    }

    /// A listening address (`daemon.listen`, `daemon.webhook_listen`, `${VAR}`
    /// expanded, so daemons on one host can take theirs from the
    /// environment): a socket address, loopback unless remote access is
    /// allowed and a token is set. A value from the environment is never
    /// quoted.
    fn listen_address(
        &mut self,
        raw: Option<&Spanned<Text>>,
        field: &str,
        default: SocketAddr,
        allow_remote: bool,
        has_token: bool,
    ) -> SocketAddr {
        let Some(l) = raw else { return default };
        if l.is_unresolved() {
            // Its expansion's error is reported already.
            return default;
        }
        match l.expose().parse::<SocketAddr>() {
            Ok(addr) => {
                if !addr.ip().is_loopback() {
                    if !allow_remote {
                        let what = if field == "daemon.listen" {
                            "the API"
                        } else {
                            "a webhook"
                        };
                        self.error(&l.span, format!("`{field}` is `{}`, which is not a loopback address", clip(l.shown())), format!("{what} can run agents and change files; to expose it set `allow_remote = true` and `token_env`, or listen on `127.0.0.1`"));
                    } else if !has_token {
                        self.error(
                            &l.span,
                            "remote listening needs a token",
                            "set `daemon.token_env` to the variable holding the API bearer token",
                        );
                    }
                }
                addr
            }
            Err(_) => {
                self.error(
                    &l.span,
                    format!("`{}` is not a socket address", clip(l.shown())),
                    format!("write an IP address and port, such as `{default}`"),
                );
                default
            }
        }
    }

    /// A program name: one executable, no placeholders.
    fn command(&mut self, command: &Spanned<String>) {
        let c = command.value.as_str();
        if c.trim().is_empty() {
            self.error(
                &command.span,
                "`command` is empty",
                "name the program to run, such as `npx` or `python3`",
            );
        } else if c.contains('$') || c.contains("{{") || c.contains("{%") {
            self.error(&command.span, format!("`command` contains a placeholder: `{}`", clip(c)), "`command` is run as written: name a bare executable and put variables in `args`, `env` or `cwd`");
        } else if c.contains(char::is_whitespace) && !Path::new(c).is_absolute() {
            self.warning(
                &command.span,
                format!("`command` contains whitespace: `{}`", clip(c)),
                "`command` is one executable, not a shell line; put arguments in `args`",
            );
        }
    }

    fn env_map(&mut self, env: TextMap) -> BTreeMap<String, Text> {
        let mut out = BTreeMap::new();
        for (k, v) in env {
            if self.env_var_name(&k, "an `env` entry").is_some() {
                out.insert(k.value, v.value);
            }
        }
        out
    }

    fn cwd(&mut self, cwd: Option<Spanned<Text>>) -> Option<Text> {
        let cwd = cwd?;
        // The rule holds for a directory from the environment too; the
        // messages never quote the value.
        if !cwd.is_unresolved() {
            self.relative_path(&cwd.span, cwd.expose(), "`cwd`");
        }
        Some(cwd.value)
    }

    /// What the OS can pass to a program: no NUL byte in the program, an
    /// argument or an environment entry (paths such as `cwd` are checked by
    /// [`Self::relative_path`]); no single string over [`MAX_ARG_STRLEN`];
    /// all of it within [`MAX_ARG_LIST_BYTES`]. Messages never quote the
    /// values (they may come from the environment).
    fn exec_limits(&mut self, command: &Spanned<String>, args: &[Spanned<Text>], env: &TextMap) {
        if command.contains('\0') {
            self.error(&command.span, "`command` contains a NUL byte", NUL_HINT);
        }
        let mut total = command.len() + 1 + ARG_POINTER_BYTES;
        for (i, arg) in args.iter().enumerate() {
            if arg.is_unresolved() {
                continue;
            }
            let value = arg.expose();
            total += value.len() + 1 + ARG_POINTER_BYTES;
            if value.contains('\0') {
                self.error(
                    &arg.span,
                    format!("argument {} contains a NUL byte", i + 1),
                    NUL_HINT,
                );
            } else if value.len() + 1 > MAX_ARG_STRLEN {
                self.error(
                    &arg.span,
                    format!(
                        "argument {} is {} bytes, more than the {} the OS passes in one argument",
                        i + 1,
                        value.len(),
                        MAX_ARG_STRLEN - 1
                    ),
                    "pass long data in a file and give its path as the argument",
                );
            }
        }
        for (key, value) in env {
            if value.is_unresolved() {
                continue;
            }
            let entry = key.len() + 1 + value.expose().len();
            total += entry + 1 + ARG_POINTER_BYTES;
            if value.expose().contains('\0') {
                self.error(
                    &value.span,
                    format!(
                        "environment value of `{}` contains a NUL byte",
                        clip(&key.value)
                    ),
                    NUL_HINT,
                );
            } else if entry + 1 > MAX_ARG_STRLEN {
                self.error(
                    &value.span,
                    format!(
                        "environment entry `{}` is {entry} bytes, more than the {} the OS passes in one entry",
                        clip(&key.value),
                        MAX_ARG_STRLEN - 1
                    ),
                    "pass long data in a file and give its path in the variable",
                );
            }
        }
        if total > MAX_ARG_LIST_BYTES {
            self.error(
                &command.span,
                format!(
                    "the arguments and environment of `{}` take {total} bytes, more than the {MAX_ARG_LIST_BYTES} npc can pass to a program",
                    clip(&command.value)
                ),
                "pass long data in files, or split the work into several commands",
            );
        }
    }

    fn command_spec(
        &mut self,
        command: Spanned<String>,
        args: Vec<Spanned<Text>>,
        env: TextMap,
        cwd: Option<Spanned<Text>>,
    ) -> CommandSpec {
        self.command(&command);
        self.exec_limits(&command, &args, &env);
        CommandSpec {
            command: command.value,
            args: args.into_iter().map(|a| a.value).collect(),
            env: self.env_map(env),
            cwd: self.cwd(cwd),
        }
    }

    fn timeout(&mut self, value: Option<Spanned<i64>>, default: u64, max: u64, what: &str) -> u64 {
        let Some(v) = value else { return default };
        if v.value < 1 || v.value as u64 > max {
            self.error(
                &v.span,
                format!("{what} `{}` is out of range", v.value),
                format!("use a value from 1 to {max} milliseconds"),
            );
            return default;
        }
        v.value as u64
    }

    fn restart(&mut self, value: Option<Spanned<String>>) -> RestartPolicy {
        let Some(v) = value else {
            return RestartPolicy::OnFailure;
        };
        RestartPolicy::parse(&v).unwrap_or_else(|| {
            let hint = suggest(&v, &RestartPolicy::NAMES);
            self.error(
                &v.span,
                format!("unknown restart policy `{}`", clip(&v.value)),
                hint,
            );
            RestartPolicy::OnFailure
        })
    }

    /// Report a name that is not a key of `section` (unless the section
    /// itself was spelled wrong: that error says it all; the reference
    /// still fails).
    fn reference(&mut self, name: &Spanned<String>, what: &str, section: &'static str) -> bool {
        if self
            .names
            .get(section)
            .is_some_and(|known| known.contains(name.as_str()))
        {
            return true;
        }
        if self.misspelled.contains(section) {
            self.errored = true;
            return false;
        }
        let hint = {
            let keys: Vec<&str> = self
                .names
                .get(section)
                .map(|known| known.iter().map(String::as_str).collect())
                .unwrap_or_default();
            match did_you_mean(name, keys.iter().copied()) {
                Some(best) => format!("did you mean `{}`?", clip(best)),
                None if keys.is_empty() => format!(
                    "there is no `[{section}]` entry; add `[{section}.{}]`",
                    clip(&name.value)
                ),
                None => format!("declared in `{section}`: {}", quoted_list(&keys)),
            }
        };
        self.error(
            &name.span,
            format!("unknown {what} `{}`", clip(&name.value)),
            hint,
        );
        false
    }
}

/// Frontmatter keys npc writes itself from profile fields.
pub const PROFILE_OWN_KEYS: [&str; 8] = [
    "name",
    "description",
    "provider",
    "model",
    "mcpServers",
    "allowedTools",
    "skills",
    "deniedTools",
];

impl Lower<'_> {
    /// One of a keyword setting's values (`parse`), its default when
    /// absent; an unknown one is an error naming the choices (and the
    /// default stands in, so the other checks still run).
    fn choice<T: Default>(
        &mut self,
        raw: Option<&Spanned<String>>,
        path: &str,
        parse: fn(&str) -> Option<T>,
        names: &[&str],
    ) -> T {
        let Some(value) = raw else {
            return T::default();
        };
        parse(value).unwrap_or_else(|| {
            let hint = suggest(value, names);
            self.error(
                &value.span,
                format!("unknown `{path}` `{}`", clip(&value.value)),
                hint,
            );
            T::default()
        })
    }
}

fn suggest(value: &str, names: &[&str]) -> String {
    match did_you_mean(value, names.iter().copied()) {
        Some(best) => format!(
            "did you mean `{best}`? expected one of {}",
            quoted_list(names)
        ),
        None => format!("expected one of {}", quoted_list(names)),
    }
}

/// Whether a relative path climbs above its starting directory.
/// Whether a relative `path` names something strictly below its start.
fn below(path: &Path) -> bool {
    let mut depth: i64 = 0;
    for c in path.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
    }
    depth > 0
}

fn escapes(path: &Path) -> bool {
    let mut depth: i64 = 0;
    for c in path.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

/// What is wrong with an MCP endpoint URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlProblem {
    NoScheme { url: String },
    Fragment,
    Credentials,
    NoHost { url: String },
    PlainHttp { host: String },
    Scheme { scheme: String },
}

/// Whether a [`UrlProblem`] may quote the URL (`Value`) or must not, because
/// it came from the environment (`Redacted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlShown {
    Value,
    Redacted,
}

impl UrlProblem {
    /// One lowercase phrase; quotes parts of the URL only when `shown` allows.
    pub fn describe(&self, shown: UrlShown) -> String {
        let quote = |part: &str| match shown {
            UrlShown::Value => format!("`{}`", clip(part)),
            UrlShown::Redacted => format!("`{}`", super::text::REDACTED),
        };
        match self {
            UrlProblem::NoScheme { url } => format!("{} has no scheme", quote(url)),
            UrlProblem::Fragment => "a URL with a fragment (`#…`)".into(),
            UrlProblem::Credentials => {
                "credentials in the URL; pass them with `bearer_token_env` or `headers`".into()
            }
            UrlProblem::NoHost { url } => format!("{} has no host", quote(url)),
            UrlProblem::PlainHttp { host } => {
                format!("plain `http` to {}, which is not loopback", quote(host))
            }
            UrlProblem::Scheme { scheme } => format!("unsupported scheme {}", quote(scheme)),
        }
    }
}

/// Check an MCP endpoint: http(s), https unless loopback, no userinfo, no fragment.
pub fn check_url(url: &str) -> Result<(), UrlProblem> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| UrlProblem::NoScheme { url: url.into() })?;
    if url.contains('#') {
        return Err(UrlProblem::Fragment);
    }
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(UrlProblem::Credentials);
    }
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    if host.is_empty() {
        return Err(UrlProblem::NoHost { url: url.into() });
    }
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match scheme {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err(UrlProblem::PlainHttp { host: host.into() }),
        other => Err(UrlProblem::Scheme {
            scheme: other.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        assert!(is_name("fs") && is_name("a-b_c9") && is_name("9lives"));
        assert!(
            !is_name("") && !is_name("Fs") && !is_name("-a") && !is_name("a.b") && !is_name("a b")
        );
    }

    #[test]
    fn urls() {
        assert!(check_url("https://mcp.example.com/mcp").is_ok());
        assert!(check_url("http://127.0.0.1:9000/mcp").is_ok());
        assert!(check_url("http://[::1]:9000/mcp").is_ok());
        assert!(check_url("http://example.com/mcp").is_err());
        assert!(check_url("https://user:pw@example.com").is_err());
        assert!(check_url("https://example.com/#x").is_err());
        assert!(check_url("ftp://example.com").is_err());
        assert!(check_url("example.com").is_err());
    }

    #[test]
    fn escaping_paths() {
        assert!(escapes(Path::new("../x")));
        assert!(escapes(Path::new("a/../../x")));
        assert!(!escapes(Path::new("a/../b")));
    }
}
