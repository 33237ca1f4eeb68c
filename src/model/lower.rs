//! Lowering: [`RawManifest`] → validated [`Manifest`], with every semantic
//! check. Each check pushes a diagnostic and moves on, so one run reports
//! every problem. Files the manifest references (prompt templates, plugin
//! packages) are read through [`Files`], never directly.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};

use indexmap::IndexMap;

use super::de::{Entry, Spanned, quoted_list};
use super::diagnostics::{Diagnostic, clip, did_you_mean, has_room};
use super::raw::*;
use super::schedule::Schedule;
use super::source::{SourceFile, Span};
use super::template;
use super::text::Text;
use super::types::*;

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
}

/// The real file system, rooted at the manifest's directory, through the
/// guarded layer (`crate::repofs`): nothing outside the root is read, only
/// regular files, at most [`MAX_TEMPLATE_BYTES`] of each.
#[derive(Debug, Clone)]
pub struct DiskFiles {
    pub root: PathBuf,
}

impl Files for DiskFiles {
    fn read_to_string(&self, path: &Path) -> std::io::Result<String> {
        crate::repofs::Root::new(&self.root)
            .and_then(|root| root.read_string(path, MAX_TEMPLATE_BYTES))
            .map_err(crate::repofs::FsError::into_reason)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.check_dir(path).is_ok()
    }
    fn check_dir(&self, path: &Path) -> std::io::Result<()> {
        crate::repofs::Root::new(&self.root)
            .and_then(|root| root.dir_check(path))
            .map_err(crate::repofs::FsError::into_reason)
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
}

/// Lower and check a raw manifest. Returns the model only when there was no error.
pub fn lower(
    raw: RawManifest,
    file: &SourceFile,
    files: &dyn Files,
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
        let (mcp, servers, builtins) = match raw.mcp.and_then(|e| e.0) {
            Some(m) => (
                McpSettings {
                    gateway: m.gateway.unwrap_or(false),
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
            mcp,
            mcp_servers: BTreeMap::new(),
            mcp_builtins,
            providers: BTreeMap::new(),
            profiles: BTreeMap::new(),
            prompts: BTreeMap::new(),
            hooks: BTreeMap::new(),
            plugins: BTreeMap::new(),
            triggers: BTreeMap::new(),
            pane_plugins: BTreeMap::new(),
            panes: BTreeMap::new(),
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
        for (name, p) in self.entries("prompts", raw.prompts) {
            if let Some(prompt) = self.prompt(&name, p) {
                m.prompts.insert(name.value, prompt);
            }
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
            if let Some(plugin) = self.plugin(p) {
                m.plugins.insert(name.value, plugin);
            }
        }
        // Sections that reference others come after what they reference.
        for (name, p) in raw_profiles {
            if let Some(profile) = self.profile(p) {
                m.profiles.insert(name.value, profile);
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
        for (event, list) in raw.hooks {
            let Some(kind) = HookEvent::parse(&event) else {
                let hint = match did_you_mean(&event, HookEvent::NAMES) {
                    Some(best) => format!("did you mean `{best}`?"),
                    None => format!("hook events are {}", quoted_list(&HookEvent::NAMES)),
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
        m
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
                allow_remote: false,
                log_level: LogLevel::Info,
            };
        };
        let token_env = raw
            .token_env
            .as_ref()
            .and_then(|t| self.env_var_name(t, "`daemon.token_env`"));
        let allow_remote = raw.allow_remote.unwrap_or(false);
        let listen = match &raw.listen {
            None => default_listen,
            Some(l) => match l.parse::<SocketAddr>() {
                Ok(addr) => {
                    if !addr.ip().is_loopback() {
                        if !allow_remote {
                            self.error(&l.span, format!("`daemon.listen` is `{addr}`, which is not a loopback address"), "the API can run agents and change files; to expose it set `allow_remote = true` and `token_env`, or listen on `127.0.0.1`");
                        } else if token_env.is_none() {
                            self.error(&l.span, "remote listening needs a token", "set `daemon.token_env` to the variable holding the API bearer token");
                        }
                    }
                    addr
                }
                Err(_) => {
                    self.error(
                        &l.span,
                        format!("`{}` is not a socket address", clip(&l.value)),
                        "write an IP address and port, such as `127.0.0.1:8766`",
                    );
                    default_listen
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
            allow_remote,
            log_level,
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

    fn mcp_builtins(&mut self, raw: Option<Spanned<RawMcpBuiltins>>) -> McpBuiltins {
        let Some(Spanned { value: raw, .. }) = raw else {
            return McpBuiltins::default();
        };
        let mut networks = Vec::new();
        for net in &raw.fetch_allow_networks {
            match IpNet::parse(net.value.trim()) {
                Some(n) => networks.push(n),
                None => self.error(
                    &net.span,
                    format!("`{}` is not a network", clip(&net.value)),
                    "write an address with a prefix length, such as `10.1.2.0/24` or `127.0.0.1/32`",
                ),
            }
        }
        let fetch_timeout_ms = self.timeout(
            raw.fetch_timeout_ms,
            DEFAULT_FETCH_TIMEOUT_MS,
            MAX_FETCH_TIMEOUT_MS,
            "`fetch_timeout_ms`",
        );
        McpBuiltins {
            fetch_allow_private: raw.fetch_allow_private.unwrap_or(false),
            fetch_allow_networks: networks,
            fetch_timeout_ms,
        }
    }

    fn mcp_server(
        &mut self,
        name: &Spanned<String>,
        Spanned { value: s, span }: Spanned<RawMcpServer>,
    ) -> Option<McpServer> {
        let startup_timeout_ms = self.timeout(
            s.startup_timeout_ms,
            DEFAULT_STARTUP_TIMEOUT_MS,
            MAX_MCP_TIMEOUT_MS,
            "`startup_timeout_ms`",
        );
        let tool_timeout_ms = self.timeout(
            s.tool_timeout_ms,
            DEFAULT_TOOL_TIMEOUT_MS,
            MAX_MCP_TIMEOUT_MS,
            "`tool_timeout_ms`",
        );
        let idle_timeout_s = match s.idle_timeout {
            None => DEFAULT_MCP_IDLE_TIMEOUT_S,
            Some(v) if (0..=MAX_MCP_IDLE_TIMEOUT_S as i64).contains(&v.value) => v.value as u64,
            Some(v) => {
                self.error(
                    &v.span,
                    format!("`idle_timeout` `{}` is out of range", v.value),
                    format!(
                        "use a number of seconds from 0 (never close) to {MAX_MCP_IDLE_TIMEOUT_S}"
                    ),
                );
                DEFAULT_MCP_IDLE_TIMEOUT_S
            }
        };
        let enabled_tools = s
            .enabled_tools
            .map(|t| t.into_iter().map(|t| t.value).collect::<Vec<_>>());
        let disabled_tools: Vec<String> = s.disabled_tools.into_iter().map(|t| t.value).collect();
        if let Some(enabled) = &enabled_tools {
            for tool in enabled.iter().filter(|t| disabled_tools.contains(t)) {
                self.warning(
                    &span,
                    format!(
                        "tool `{tool}` of server `{}` is both enabled and disabled",
                        name.value
                    ),
                    "it stays disabled; remove it from one of the lists",
                );
            }
        }
        let restart = self.restart(s.restart);
        let transport = match (s.command, s.url) {
            (Some(_), Some(url)) => {
                self.error(
                    &url.span,
                    format!(
                        "MCP server `{}` has both `command` and `url`",
                        clip(&name.value)
                    ),
                    "a server is either stdio (`command`) or streamable HTTP (`url`); remove one",
                );
                return None;
            }
            (None, None) => {
                self.error(&name.span, format!("MCP server `{}` has neither `command` nor `url`", clip(&name.value)), "add `command = \"…\"` for a stdio server or `url = \"https://…\"` for an HTTP server");
                return None;
            }
            (Some(command), None) => {
                if let Some((key, _)) = s.headers.first() {
                    self.error(
                        &key.span,
                        format!(
                            "`headers` only apply to HTTP servers, and `{}` is a stdio server",
                            name.value
                        ),
                        "remove `headers`, or give the server a `url`",
                    );
                }
                if let Some(token) = &s.bearer_token_env {
                    self.error(&token.span, format!("`bearer_token_env` only applies to HTTP servers, and `{}` is a stdio server", clip(&name.value)), "remove it, or pass the token through `env`");
                }
                McpTransport::Stdio(self.command_spec(command, s.args, s.env, s.cwd))
            }
            (None, Some(url)) => {
                for (what, present) in [
                    ("args", !s.args.is_empty()),
                    ("env", !s.env.is_empty()),
                    ("cwd", s.cwd.is_some()),
                ] {
                    if present {
                        self.error(&url.span, format!("`{what}` only applies to stdio servers, and `{}` is an HTTP server", clip(&name.value)), format!("remove `{what}`"));
                    }
                }
                // The rules hold for a URL from the environment too; then
                // the message names the reference, never the value.
                if !url.is_unresolved()
                    && let Err(problem) = check_url(url.expose())
                {
                    let summary = match (url.is_secret(), url.source()) {
                        (true, Some(source)) => format!(
                            "invalid MCP server URL from `{}`: {}",
                            clip(source),
                            problem.describe(UrlShown::Redacted)
                        ),
                        (true, None) => format!(
                            "invalid MCP server URL: {}",
                            problem.describe(UrlShown::Redacted)
                        ),
                        (false, _) => format!(
                            "invalid MCP server URL: {}",
                            problem.describe(UrlShown::Value)
                        ),
                    };
                    self.error(
                        &url.span,
                        summary,
                        "use `https://host/path`, or `http://` on loopback only",
                    );
                }
                let mut headers = BTreeMap::new();
                let mut seen: HashMap<String, Span> = HashMap::new();
                for (key, value) in s.headers {
                    let lower = key.to_ascii_lowercase();
                    if !key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
                        || key.is_empty()
                    {
                        self.error(
                            &key.span,
                            format!("`{}` is not a valid HTTP header name", clip(&key.value)),
                            "header names are letters, digits and `-`",
                        );
                    } else if let Some(first) = seen.get(&lower) {
                        let line = self.file.position(first.start).line;
                        self.error(
                            &key.span,
                            format!("duplicate header `{}`", clip(&key.value)),
                            format!("header names ignore case; it is already set on line {line}"),
                        );
                    } else if value.value.expose().contains(['\r', '\n', '\0']) {
                        // The value is not quoted: it may be a secret.
                        self.error(
                            &value.span,
                            format!(
                                "the value of header `{}` contains a line break or a NUL byte",
                                clip(&key.value)
                            ),
                            "an HTTP header value is one line of text; remove the line break (a value with one could inject headers)",
                        );
                    } else {
                        seen.insert(lower, key.span.clone());
                        headers.insert(key.value, value.value);
                    }
                }
                let bearer_token_env = s
                    .bearer_token_env
                    .as_ref()
                    .and_then(|t| self.env_var_name(t, "`bearer_token_env`"));
                McpTransport::Http {
                    url: url.value,
                    headers,
                    bearer_token_env,
                }
            }
        };
        Some(McpServer {
            transport,
            enabled: s.enabled.unwrap_or(true),
            startup_timeout_ms,
            tool_timeout_ms,
            idle_timeout_s,
            enabled_tools,
            disabled_tools,
            restart,
        })
    }

    fn provider(&mut self, Spanned { value: p, .. }: Spanned<RawProvider>) -> Option<Provider> {
        let Some(kind) = ProviderKind::parse(&p.kind) else {
            let hint = suggest(&p.kind, &ProviderKind::NAMES);
            self.error(
                &p.kind.span,
                format!("unknown provider kind `{}`", clip(&p.kind.value)),
                hint,
            );
            return None;
        };
        let command = match p.command {
            Some(c) => c,
            None => Spanned {
                span: p.kind.span.clone(),
                value: kind.default_command().to_string(),
            },
        };
        self.command(&command);
        self.exec_limits(&command, &p.args, &p.env);
        let command = command.value;
        if let Some(req) = &p.version
            && let Err(e) = semver::VersionReq::parse(req)
        {
            self.error(
                &req.span,
                format!("`{}` is not a version requirement: {e}", clip(&req.value)),
                "write a semver requirement such as `>=2.0` or `^1.4, <2`",
            );
        }
        Some(Provider {
            kind,
            command,
            args: p.args.into_iter().map(|a| a.value).collect(),
            env: self.env_map(p.env),
            version: p.version.map(|v| v.value),
        })
    }

    fn prompt(
        &mut self,
        name: &Spanned<String>,
        Spanned { value: p, span }: Spanned<RawPrompt>,
    ) -> Option<Prompt> {
        let mut variables = BTreeMap::new();
        for (var, entry) in p.variables {
            if !is_env_name(&var) {
                self.error(&var.span, format!("`{}` is not a valid variable name", clip(&var.value)), "variable names are letters, digits and `_`, usable as `vars.NAME` in the template");
            }
            if let Entry(Some(v)) = entry {
                variables.insert(
                    var.value,
                    Variable {
                        description: v.value.description,
                        default: v.value.default.map(|d| d.value),
                    },
                );
            }
        }
        let (source, template, template_file) = match (p.template, p.file) {
            (Some(_), Some(file)) => {
                self.error(
                    &file.span,
                    format!(
                        "prompt `{}` has both `template` and `file`",
                        clip(&name.value)
                    ),
                    "keep one: inline `template` or a `file` to read it from",
                );
                return None;
            }
            (None, None) => {
                self.error(
                    &span,
                    format!(
                        "prompt `{}` has neither `template` nor `file`",
                        clip(&name.value)
                    ),
                    "add `template = \"…\"` or `file = \"prompts/NAME.md.j2\"`",
                );
                return None;
            }
            (Some(text), None) => {
                let located = template::TemplateSource::inline(self.file, &text.span, &text.value);
                (PromptSource::Inline, text.value, located)
            }
            (None, Some(path)) => {
                if !self.relative_path(&path.span, &path.value, "the prompt `file`") {
                    return None;
                }
                match self.files.read_to_string(Path::new(&path.value)) {
                    Ok(text) if text.len() > MAX_TEMPLATE_BYTES => {
                        self.error(
                            &path.span,
                            format!(
                                "prompt file `{}` is larger than {MAX_TEMPLATE_BYTES} bytes",
                                path.value
                            ),
                            "split the template, or move data out of it",
                        );
                        return None;
                    }
                    Ok(text) => {
                        // Name the file as the manifest is named (relative to
                        // the same directory), so the location can be opened.
                        let shown = Path::new(self.file.name())
                            .parent()
                            .unwrap_or(Path::new(""))
                            .join(&path.value);
                        let located =
                            template::TemplateSource::file(&shown.to_string_lossy(), &text);
                        (PromptSource::File { path: path.value }, text, located)
                    }
                    Err(e) => {
                        let why = io_reason(&e);
                        self.error(&path.span, format!("prompt file `{}` {why}", clip(&path.value)), "create the file, or fix the path (relative to the manifest's directory)");
                        return None;
                    }
                }
            }
        };
        let declared: BTreeSet<&str> = variables.keys().map(String::as_str).collect();
        let env = self.templates.get_or_insert_with(template::environment);
        let found = template::check(
            env,
            name,
            &template,
            &template_file,
            &declared,
            &mut self.probe_fuel,
        );
        self.diags.extend(found);
        Some(Prompt {
            source,
            template,
            variables,
        })
    }

    fn profile(&mut self, Spanned { value: p, .. }: Spanned<RawProfile>) -> Option<Profile> {
        self.reference(&p.provider, "provider", "providers");
        if let Some(prompt) = &p.prompt {
            self.reference(prompt, "prompt", "prompts");
        }
        for server in &p.mcp_servers {
            self.reference(server, "MCP server", "mcp.servers");
        }
        if p.description.trim().is_empty() {
            self.error(
                &p.description.span,
                "profile `description` is empty",
                "say in a sentence what the agent is for; the profile format requires it",
            );
        }
        for pattern in p.allowed_tools.iter().chain(&p.denied_tools) {
            if pattern.trim().is_empty() {
                self.error(
                    &pattern.span,
                    "empty tool pattern",
                    "remove it, or write a pattern such as `mcp__fs__*`",
                );
            }
        }
        let mut frontmatter = BTreeMap::new();
        for (key, value) in p.frontmatter {
            if PROFILE_OWN_KEYS.contains(&key.as_str()) {
                self.error(
                    &key.span,
                    format!("frontmatter key `{}` is set by npc", clip(&key.value)),
                    "set it with the profile field of the same meaning instead",
                );
            } else {
                frontmatter.insert(key.value, value);
            }
        }
        Some(Profile {
            provider: p.provider.value,
            description: p.description.value,
            prompt: p.prompt.map(|v| v.value),
            mcp_servers: p.mcp_servers.into_iter().map(|v| v.value).collect(),
            allowed_tools: p.allowed_tools.into_iter().map(|v| v.value).collect(),
            denied_tools: p.denied_tools.into_iter().map(|v| v.value).collect(),
            model: p.model.map(|v| v.value),
            skills: p.skills.into_iter().map(|v| v.value).collect(),
            frontmatter: Frontmatter(frontmatter),
        })
    }

    /// Report a name that is not a key of `section`.
    fn reference(&mut self, name: &Spanned<String>, what: &str, section: &'static str) -> bool {
        if self
            .names
            .get(section)
            .is_some_and(|known| known.contains(name.as_str()))
        {
            return true;
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

    fn hook(
        &mut self,
        event: HookEvent,
        Spanned { value: h, .. }: Spanned<RawHook>,
    ) -> Option<Hook> {
        let timeout_ms = match h.timeout_ms {
            Some(v) if !(1..=MAX_HOOK_TIMEOUT_MS as i64).contains(&v.value) => {
                self.error(&v.span, format!("hook `timeout_ms` `{}` is out of range", v.value), format!("use 1 to {MAX_HOOK_TIMEOUT_MS} milliseconds (default {DEFAULT_HOOK_TIMEOUT_MS})"));
                DEFAULT_HOOK_TIMEOUT_MS
            }
            Some(v) => v.value as u64,
            None => DEFAULT_HOOK_TIMEOUT_MS,
        };
        if let Some(matcher) = &h.matcher {
            if !matches!(event, HookEvent::BeforeTool | HookEvent::AfterTool) {
                self.warning(
                    &matcher.span,
                    format!("`matcher` has no effect on `{}` hooks", event.as_str()),
                    "only `before_tool` and `after_tool` hooks match tool names; remove it",
                );
            }
            if let Err(e) = regex::Regex::new(matcher) {
                let detail = e
                    .to_string()
                    .lines()
                    .last()
                    .unwrap_or("")
                    .trim()
                    .trim_start_matches("error:")
                    .trim()
                    .to_lowercase();
                self.error(
                    &matcher.span,
                    format!("`matcher` is not a valid regular expression: {detail}"),
                    "write a regular expression on tool names, such as `^mcp__fs__.*`",
                );
            }
        }
        let run = self.command_spec(h.command, h.args, h.env, h.cwd);
        Some(Hook {
            run,
            timeout_ms,
            matcher: h.matcher.map(|m| m.value),
        })
    }

    fn plugin(&mut self, Spanned { value: p, .. }: Spanned<RawPlugin>) -> Option<Plugin> {
        if self.relative_path(&p.path.span, &p.path.value, "the plugin `path`") {
            let dir = Path::new(&p.path.value);
            if let Err(e) = self.files.check_dir(dir) {
                self.error(&p.path.span, format!("plugin directory `{}` {}", clip(&p.path.value), io_reason(&e)), "fix the path (relative to the manifest's directory), or create the package there (a directory with a `plugin.json`)");
            } else if self.files.read_to_string(&dir.join("plugin.json")).is_err() {
                self.error(
                    &p.path.span,
                    format!(
                        "`{}` is not an Agent Plugins package: it has no readable `plugin.json`",
                        p.path.value
                    ),
                    "point `path` at the package root, the directory holding `plugin.json`",
                );
            }
        }
        Some(Plugin {
            path: p.path.value,
            enabled: p.enabled.unwrap_or(true),
        })
    }

    fn trigger(
        &mut self,
        Spanned { value: t, span }: Spanned<RawTrigger>,
        m: &Manifest,
        routes: &mut HashMap<String, Span>,
    ) -> Option<Trigger> {
        const KINDS: [&str; 3] = ["cron", "webhook", "file_watch"];
        let kind = t.kind.as_str();
        let fields: [(&str, bool, &[&str]); 6] = [
            ("schedule", t.schedule.is_some(), &["cron"]),
            ("timezone", t.timezone.is_some(), &["cron"]),
            ("route", t.route.is_some(), &["webhook"]),
            ("secret_env", t.secret_env.is_some(), &["webhook"]),
            ("paths", !t.paths.is_empty(), &["file_watch"]),
            ("debounce_ms", t.debounce_ms.is_some(), &["file_watch"]),
        ];
        if KINDS.contains(&kind) {
            for (field, present, kinds) in fields {
                if present && !kinds.contains(&kind) {
                    self.error(
                        &t.kind.span,
                        format!("`{field}` does not apply to a `{kind}` trigger"),
                        format!("`{field}` belongs to `{}` triggers; remove it", kinds[0]),
                    );
                }
            }
        }
        let source = match kind {
            "cron" => {
                let Some(expr) = &t.schedule else {
                    self.error(&span, "a `cron` trigger needs a `schedule`", "add `schedule = \"0 3 * * *\"` (crontab) or `schedule = \"15m\"` (an interval)");
                    return None;
                };
                let schedule = match expr.parse::<Schedule>() {
                    Ok(s) => Some(s),
                    Err(e) => {
                        self.error(&expr.span, format!("invalid schedule `{}`: {e}", clip(&expr.value)), "write 5 crontab fields (minute hour day-of-month month day-of-week), a macro such as `@daily`, or an interval such as `15m`");
                        None
                    }
                };
                let timezone = match &t.timezone {
                    Some(tz) if tz.parse::<chrono_tz::Tz>().is_err() => {
                        let hint =
                            match did_you_mean(tz, chrono_tz::TZ_VARIANTS.iter().map(|z| z.name()))
                            {
                                Some(best) => format!("did you mean `{best}`?"),
                                None => {
                                    "use an IANA time zone name such as `UTC` or `Europe/Berlin`"
                                        .to_string()
                                }
                            };
                        self.error(
                            &tz.span,
                            format!("unknown time zone `{}`", clip(&tz.value)),
                            hint,
                        );
                        "UTC".to_string()
                    }
                    Some(tz) => tz.value.clone(),
                    None => "UTC".to_string(),
                };
                if !t.events.is_empty() {
                    self.error(
                        &t.events[0].span,
                        "`events` does not apply to a `cron` trigger",
                        "remove it",
                    );
                }
                TriggerSource::Cron {
                    schedule: schedule?,
                    timezone,
                }
            }
            "webhook" => {
                let Some(route) = &t.route else {
                    self.error(
                        &span,
                        "a `webhook` trigger needs a `route`",
                        "add `route = \"github\"`; requests then arrive at `POST /webhooks/github`",
                    );
                    return None;
                };
                let valid =
                    !route.is_empty() && route.split('/').all(is_name) && !route.starts_with('/');
                if !valid {
                    self.error(&route.span, format!("invalid webhook route `{}`", clip(&route.value)), "routes are `/`-separated names of lowercase letters, digits, `_` and `-`, such as `github/push`");
                } else if let Some(first) = routes.get(&route.value) {
                    let line = self.file.position(first.start).line;
                    self.error(&route.span, format!("duplicate webhook route `{}`", clip(&route.value)), format!("another trigger already uses it on line {line}; each route has one trigger"));
                } else {
                    routes.insert(route.value.clone(), route.span.clone());
                }
                let secret_env = t
                    .secret_env
                    .as_ref()
                    .and_then(|s| self.env_var_name(s, "`secret_env`"));
                if t.secret_env.is_none() {
                    self.warning(&route.span, format!("webhook route `{}` has no `secret_env`", clip(&route.value)), "without a secret, any local process can fire it; set `secret_env` to verify signatures");
                }
                TriggerSource::Webhook {
                    route: route.value.clone(),
                    secret_env,
                    events: t.events.iter().map(|e| e.value.clone()).collect(),
                }
            }
            "file_watch" => {
                if t.paths.is_empty() {
                    self.error(
                        &span,
                        "a `file_watch` trigger needs `paths`",
                        "add `paths = [\"src/**/*.rs\"]`",
                    );
                }
                for path in &t.paths {
                    if self.relative_path(&path.span, &path.value, "a watched path")
                        && let Err(e) = globset::Glob::new(path)
                    {
                        self.error(&path.span, format!("invalid glob `{}`: {}", path.value, e.kind()), "fix the pattern; `*` matches within a directory and `**` across directories");
                    }
                }
                let mut events = Vec::new();
                for event in &t.events {
                    match FileEvent::parse(event) {
                        Some(e) => events.push(e),
                        None => {
                            let hint = suggest(event, &FileEvent::NAMES);
                            self.error(
                                &event.span,
                                format!("unknown file event `{}`", clip(&event.value)),
                                hint,
                            );
                        }
                    }
                }
                if t.events.is_empty() {
                    events = FileEvent::ALL.to_vec();
                }
                events.sort();
                events.dedup();
                let debounce_ms = match &t.debounce_ms {
                    Some(d) if !(0..=MAX_DEBOUNCE_MS as i64).contains(&d.value) => {
                        self.error(
                            &d.span,
                            format!("`debounce_ms` `{}` is out of range", d.value),
                            format!("use 0 to {MAX_DEBOUNCE_MS} milliseconds"),
                        );
                        DEFAULT_DEBOUNCE_MS
                    }
                    Some(d) => d.value as u64,
                    None => DEFAULT_DEBOUNCE_MS,
                };
                TriggerSource::FileWatch {
                    paths: t.paths.iter().map(|p| p.value.clone()).collect(),
                    events,
                    debounce_ms,
                }
            }
            other => {
                let hint = suggest(other, &KINDS);
                self.error(
                    &t.kind.span,
                    format!("unknown trigger kind `{}`", clip(other)),
                    hint,
                );
                return None;
            }
        };
        let action = self.action(t.action, m)?;
        Some(Trigger {
            enabled: t.enabled.unwrap_or(true),
            source,
            action,
        })
    }

    fn action(
        &mut self,
        Spanned { value: a, span }: Spanned<RawAction>,
        m: &Manifest,
    ) -> Option<Action> {
        match (a.profile, a.command) {
            (Some(_), Some(command)) => {
                self.error(
                    &command.span,
                    "an action runs a `profile` or a `command`, not both",
                    "split it into two triggers, or remove one",
                );
                None
            }
            (None, None) => {
                self.error(&span, "the action has neither `profile` nor `command`", "add `profile = \"NAME\"` to run an agent, or `command = \"…\"` to run a program");
                None
            }
            (Some(profile), None) => {
                for (what, present) in [
                    ("args", !a.args.is_empty()),
                    ("env", !a.env.is_empty()),
                    ("cwd", a.cwd.is_some()),
                ] {
                    if present {
                        self.error(
                            &profile.span,
                            format!("`{what}` applies to `command` actions, not `profile` actions"),
                            format!("remove `{what}`, or pass values through `vars`"),
                        );
                    }
                }
                self.reference(&profile, "profile", "profiles");
                if let Some(prompt) = &a.prompt {
                    if let (true, Some(declared)) = (
                        self.reference(prompt, "prompt", "prompts"),
                        m.prompts.get(&prompt.value),
                    ) {
                        let declared = &declared.variables;
                        for (var, _) in &a.vars {
                            if !declared.contains_key(&var.value) {
                                let hint =
                                    match did_you_mean(var, declared.keys().map(String::as_str)) {
                                        Some(best) => format!("did you mean `{best}`?"),
                                        None => format!(
                                            "declare it under `[prompts.{}.variables]`",
                                            prompt.value
                                        ),
                                    };
                                self.error(
                                    &var.span,
                                    format!(
                                        "prompt `{}` has no variable `{}`",
                                        prompt.value, var.value
                                    ),
                                    hint,
                                );
                            }
                        }
                        for (name, var) in declared {
                            if var.default.is_none() && !a.vars.keys().any(|k| k.value == *name) {
                                self.error(&prompt.span, format!("prompt `{}` needs variable `{name}`", clip(&prompt.value)), format!("add `vars = {{ {name} = \"…\" }}` to the action, or give the variable a default"));
                            }
                        }
                    }
                } else if !a.vars.is_empty() {
                    self.error(
                        &profile.span,
                        "`vars` without a `prompt`",
                        "name the prompt the variables are for with `prompt = \"NAME\"`",
                    );
                }
                let vars = a
                    .vars
                    .into_iter()
                    .map(|(k, v)| (k.value, v.value))
                    .collect();
                Some(Action::RunProfile {
                    profile: profile.value,
                    prompt: a.prompt.map(|p| p.value),
                    vars,
                })
            }
            (None, Some(command)) => {
                if let Some(prompt) = &a.prompt {
                    self.error(
                        &prompt.span,
                        "`prompt` applies to `profile` actions, not `command` actions",
                        "remove `prompt`",
                    );
                }
                if let Some((var, _)) = a.vars.first() {
                    self.error(
                        &var.span,
                        "`vars` applies to `profile` actions, not `command` actions",
                        "pass values through `args` or `env`",
                    );
                }
                Some(Action::RunCommand(
                    self.command_spec(command, a.args, a.env, a.cwd),
                ))
            }
        }
    }

    fn pane_plugin(
        &mut self,
        Spanned { value: p, .. }: Spanned<RawPanePlugin>,
    ) -> Option<PanePlugin> {
        for flag in &p.allowed_resume_flags {
            if flag.is_empty()
                || flag.contains(SHELL_METACHARACTERS)
                || flag.contains(char::is_whitespace)
            {
                self.error(&flag.span, format!("resume flag `{}` is not a plain flag", clip(&flag.value)), "list single flags or subcommands such as `--session` or `resume`, without spaces or shell characters");
            }
        }
        let restart = self.restart(p.restart);
        let run = self.command_spec(p.command, p.args, p.env, None);
        Some(PanePlugin {
            run,
            enabled: p.enabled.unwrap_or(false),
            watch_on_signal: p.watch_on_signal.unwrap_or(false),
            allowed_resume_flags: p
                .allowed_resume_flags
                .into_iter()
                .map(|f| f.value)
                .collect(),
            restart,
        })
    }

    fn pane(
        &mut self,
        name: &Spanned<String>,
        Spanned { value: p, .. }: Spanned<RawPane>,
        m: &Manifest,
    ) -> Option<Pane> {
        if let Some(plugin) = &p.plugin
            && self.reference(plugin, "pane plugin", "pane_plugins")
            && m.pane_plugins
                .get(&plugin.value)
                .is_some_and(|p| !p.enabled)
        {
            self.warning(
                &plugin.span,
                format!(
                    "pane `{}` opts into pane plugin `{}`, which is disabled",
                    name.value, plugin.value
                ),
                format!(
                    "set `enabled = true` under `[pane_plugins.{}]`",
                    plugin.value
                ),
            );
        }
        let run = self.command_spec(p.command, p.args, p.env, p.cwd);
        Some(Pane {
            run,
            plugin: p.plugin.map(|p| p.value),
        })
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
