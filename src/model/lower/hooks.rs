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
        Spanned { value: p, .. }: Spanned<RawPlugin>,
    ) -> Option<Plugin> {
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
            }
        }
        Some(Plugin {
            path: p.path.value,
            enabled: p.enabled.unwrap_or(true),
        })
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
        for problem in report.problems.iter().take(MAX_PLUGIN_DIAGNOSTICS) {
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
            self.error(
                &path.span,
                format!(
                    "plugin `{}` has {} more problems",
                    clip(&path.value),
                    total - MAX_PLUGIN_DIAGNOSTICS
                ),
                hint,
            );
        }
    }
}

/// Most problems of one plugin package quoted in the manifest's diagnostics.
pub const MAX_PLUGIN_DIAGNOSTICS: usize = 20;
