//! Lowering of Panes and pane plugins (`[panes.*]`, `[pane_plugins.*]`).

use super::*;

/// Default quiet time before a pane counts as idle.
pub const DEFAULT_IDLE_MS: u64 = 2_000;
/// Longest `idle_ms`.
pub const MAX_IDLE_MS: u64 = 3_600_000;
/// Default time an exited pane is held for its plugin's relaunch
/// (nightcrow's `PENDING_RELAUNCH_TTL`).
pub const PENDING_RELAUNCH_TTL_MS: u64 = 120_000;
/// Longest `relaunch_ttl_ms`.
pub const MAX_RELAUNCH_TTL_MS: u64 = 86_400_000;

impl Lower<'_> {
    pub(super) fn pane_plugin(
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

    pub(super) fn pane(
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
        let idle_ms = self.timeout(p.idle_ms, DEFAULT_IDLE_MS, MAX_IDLE_MS, "`idle_ms`");
        let relaunch_ttl_ms = self.timeout(
            p.relaunch_ttl_ms,
            PENDING_RELAUNCH_TTL_MS,
            MAX_RELAUNCH_TTL_MS,
            "`relaunch_ttl_ms`",
        );
        let run = self.command_spec(p.command, p.args, p.env, p.cwd);
        Some(Pane {
            run,
            plugin: p.plugin.map(|p| p.value),
            idle_ms,
            relaunch_ttl_ms,
        })
    }
}
