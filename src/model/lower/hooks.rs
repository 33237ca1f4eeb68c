//! Lowering of Lifecycle hooks (`[[hooks.*]]`) and plugin packages (`[plugins.*]`).

use super::*;

impl Lower<'_> {
    pub(super) fn hook(
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

    pub(super) fn plugin(
        &mut self,
        name: &Spanned<String>,
        Spanned { value: p, .. }: Spanned<RawPlugin>,
        servers: &mut BTreeMap<String, McpServer>,
    ) -> Option<Plugin> {
        let enabled = p.enabled.unwrap_or(true);
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
            } else if let Some(report) = self.files.plugin_report(dir) {
                self.plugin_problems(&p.path, &report);
                if let Some(pkg) = report.package.as_ref().filter(|_| enabled) {
                    self.plugin_servers(name, &p.path, pkg, servers);
                }
            }
        }
        Some(Plugin {
            path: p.path.value,
            enabled,
        })
    }

    /// An enabled plugin's MCP servers join the manifest's as
    /// `PLUGIN__SERVER` (characters other than `A-Za-z0-9_-` become `-`),
    /// so the daemon runs them through the pool like any server and the
    /// agents see them; `${PLUGIN_ROOT}` and `${PLUGIN_DATA}` are expanded
    /// here, once, and both are set in the environment (§9). A manifest
    /// server of the same name is kept (`keep_first`) and this one dropped.
    fn plugin_servers(
        &mut self,
        name: &Spanned<String>,
        path: &Spanned<String>,
        pkg: &crate::plugins::Package,
        servers: &mut BTreeMap<String, McpServer>,
    ) {
        use crate::plugins::mcp::Transport;
        let data = match crate::plugins::data::dir_of(&pkg.manifest.name) {
            Ok(d) => d,
            Err(e) => {
                if !pkg.servers.is_empty() {
                    self.error(
                        &path.span,
                        format!("plugin `{}`: {e}", clip(&name.value)),
                        "npc keeps each plugin's data under the user's data directory",
                    );
                }
                return;
            }
        };
        let places = crate::plugins::expand::Placeholders {
            root: &pkg.root,
            data: &data,
        };
        for server in &pkg.servers {
            let id = format!("{}__{}", name.value, server.name)
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect::<String>();
            let transport = match &server.transport {
                Transport::Stdio {
                    command,
                    args,
                    env,
                    cwd,
                } => {
                    let program = match command.strip_prefix("./") {
                        Some(rel) => pkg.root.join(rel).to_string_lossy().into_owned(),
                        None => command.clone(),
                    };
                    McpTransport::Stdio(CommandSpec {
                        command: program,
                        args: places
                            .expand_all(args)
                            .into_iter()
                            .map(Text::plain)
                            .collect(),
                        env: crate::plugins::data::plugin_env(env, &places)
                            .into_iter()
                            .map(|(k, v)| (k, Text::plain(v)))
                            .collect(),
                        cwd: Some(Text::plain(places.cwd(cwd.as_deref()).to_string_lossy())),
                    })
                }
                Transport::StreamableHttp { url, headers } => McpTransport::Http {
                    url: Text::plain(url.clone()),
                    headers: headers
                        .iter()
                        .map(|(k, v)| (k.clone(), Text::plain(v.clone())))
                        .collect(),
                    bearer_token_env: None,
                },
                Transport::Sse { .. } => {
                    self.warning(&path.span, format!("plugin `{}`: server `{}` uses the legacy `sse` transport, which npc does not run; it is skipped", clip(&name.value), clip(&server.name)), "use `streamable-http`");
                    continue;
                }
            };
            if servers.contains_key(&id) {
                self.warning(
                    &path.span,
                    format!("plugin `{}`: server `{id}` is also declared under `[mcp.servers]`; the manifest's is kept (`keep_first`)", clip(&name.value)),
                    "rename one of them",
                );
                continue;
            }
            servers.insert(
                id,
                McpServer {
                    transport,
                    enabled: true,
                    startup_timeout_ms: DEFAULT_STARTUP_TIMEOUT_MS,
                    tool_timeout_ms: DEFAULT_TOOL_TIMEOUT_MS,
                    idle_timeout_s: DEFAULT_MCP_IDLE_TIMEOUT_S,
                    enabled_tools: None,
                    disabled_tools: Vec::new(),
                    restart: RestartPolicy::OnFailure,
                },
            );
        }
    }

    /// A package's own problems at its `path`, errors as errors: the
    /// manifest is invalid while a package it declares is (the daemon keeps
    /// the last good runtime); `npc plugin validate` shows them in full.
    fn plugin_problems(&mut self, path: &Spanned<String>, report: &crate::plugins::Report) {
        let hint = format!(
            "run `npc plugin validate {}` for the details",
            clip(&path.value)
        );
        let total = report.problems.len() + report.omitted;
        // Errors first, so a cut never hides why the manifest is invalid.
        let (errors, warnings): (Vec<_>, Vec<_>) =
            report.problems.iter().partition(|p| p.is_error());
        for problem in errors.iter().chain(&warnings).take(MAX_PLUGIN_DIAGNOSTICS) {
            let summary = format!(
                "plugin `{}`: `{}`: {}",
                clip(&path.value),
                problem.place(),
                problem.message
            );
            let hint = problem.hint.clone().unwrap_or_else(|| hint.clone());
            if problem.is_error() {
                self.error(&path.span, summary, hint);
            } else {
                self.warning(&path.span, summary, hint);
            }
        }
        if total > MAX_PLUGIN_DIAGNOSTICS {
            let summary = format!(
                "plugin `{}` has {} more problems",
                clip(&path.value),
                total - MAX_PLUGIN_DIAGNOSTICS
            );
            let more_errors = report.omitted_errors > 0 || errors.len() > MAX_PLUGIN_DIAGNOSTICS;
            if more_errors {
                self.error(&path.span, summary, hint);
            } else {
                self.warning(&path.span, summary, hint);
            }
        }
    }
}

/// Most problems of one plugin package quoted in the manifest's diagnostics.
pub const MAX_PLUGIN_DIAGNOSTICS: usize = 20;
