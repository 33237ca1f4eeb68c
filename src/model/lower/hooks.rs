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
            if let Err(detail) = check_matcher(matcher) {
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
        let mut parts = None;
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
            } else if let Some(view) = self.files.package(&name.value, dir) {
                self.plugin_problems(&p.path, &view);
                if let Some(contents) = view.contents.filter(|_| enabled) {
                    parts = self.plugin_parts(name, &p.path, contents, servers);
                }
            }
        }
        Some(Plugin {
            path: p.path.value,
            enabled,
            source: PluginSource::Manifest,
            parts,
        })
    }

    /// An enabled plugin's MCP servers join the manifest's as
    /// `PLUGIN__SERVER` (see `crate::plugins::resolve`), so the daemon runs
    /// them through the pool like any server and the agents see them;
    /// `${PLUGIN_ROOT}` and `${PLUGIN_DATA}` are expanded there, once, and
    /// both are set in the environment (§9). A manifest server of the same
    /// name is kept (`keep_first`) and this one dropped. Returns the
    /// plugin's hooks and skills.
    fn plugin_parts(
        &mut self,
        name: &Spanned<String>,
        path: &Spanned<String>,
        contents: PackageContents,
        servers: &mut BTreeMap<String, McpServer>,
    ) -> Option<PluginParts> {
        let (found, skipped, parts) = match contents {
            PackageContents::Resolved {
                servers,
                skipped,
                parts,
            } => (servers, skipped, parts),
            PackageContents::NoDataDir {
                reason,
                runs_something,
            } => {
                if runs_something {
                    self.error(
                        &path.span,
                        format!("plugin `{}`: {reason}", clip(&name.value)),
                        "npc keeps each plugin's data under the user's data directory",
                    );
                }
                return None;
            }
        };
        for s in skipped {
            self.warning(
                &path.span,
                format!(
                    "plugin `{}`: server `{}` is skipped: {}",
                    clip(&name.value),
                    clip(&s.server),
                    s.reason
                ),
                "use `streamable-http`",
            );
        }
        for (id, server) in found {
            if servers.contains_key(&id) {
                self.warning(
                    &path.span,
                    format!("plugin `{}`: server `{id}` is also declared under `[mcp.servers]`; the manifest's is kept (`keep_first`)", clip(&name.value)),
                    "rename one of them",
                );
                continue;
            }
            servers.insert(id, server);
        }
        Some(parts)
    }

    /// A package's own problems at its `path`, errors as errors: the
    /// manifest is invalid while a package it declares is (the daemon keeps
    /// the last good runtime); `npc plugin validate` shows them in full.
    fn plugin_problems(&mut self, path: &Spanned<String>, report: &PackageView) {
        let hint = format!(
            "run `npc plugin validate {}` for the details",
            clip(&path.value)
        );
        let total = report.problems.len() + report.omitted;
        // Errors first, so a cut never hides why the manifest is invalid.
        let (errors, warnings): (Vec<_>, Vec<_>) = report.problems.iter().partition(|p| p.error);
        for problem in errors.iter().chain(&warnings).take(MAX_PLUGIN_DIAGNOSTICS) {
            let summary = format!(
                "plugin `{}`: `{}`: {}",
                clip(&path.value),
                problem.place,
                problem.message
            );
            let hint = problem.hint.clone().unwrap_or_else(|| hint.clone());
            if problem.error {
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

/// Longest matcher checked by its syntax alone; a longer one, or one with a
/// counted repetition, is compiled, since only those can outgrow the regex
/// engine's size limit.
pub const MATCHER_SYNTAX_ONLY_MAX: usize = 64;

/// Whether `matcher` is a regular expression the hook engine can run: its
/// syntax, checked without building an automaton (compiling one costs a
/// hundred times more, on every manifest load), and for a pattern that could
/// be too big ([`MATCHER_SYNTAX_ONLY_MAX`], `{n}`) the compile itself. The
/// error is the engine's last line, lowercase.
fn check_matcher(matcher: &str) -> Result<(), String> {
    let error = if matcher.len() > MATCHER_SYNTAX_ONLY_MAX || matcher.contains('{') {
        regex::Regex::new(matcher).err().map(|e| e.to_string())
    } else {
        regex_syntax::Parser::new()
            .parse(matcher)
            .err()
            .map(|e| e.to_string())
    };
    match error {
        None => Ok(()),
        Some(text) => Err(text
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .trim_start_matches("error:")
            .trim()
            .to_lowercase()),
    }
}
