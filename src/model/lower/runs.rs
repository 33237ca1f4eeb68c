//! Lowering of how runs are carried out: `[runs]`, and the workspace
//! settings triggers and profiles share (`workspace`, `ref`, `branch`,
//! `setup`, `copy`, `after`, `push`, `expect_changes`), with the templates among them (`ref`,
//! `branch`, `concurrency_key`) and a webhook's `filter` compiled here, so a
//! mistake is an error of `npc validate`, not of a run.

use super::*;

/// The raw workspace fields a trigger or a profile holds.
pub(super) struct RawWorkspace<'a> {
    pub mode: Option<&'a Spanned<String>>,
    pub base_ref: Option<&'a Spanned<String>>,
    pub branch: Option<&'a Spanned<String>>,
    pub setup: &'a [Spanned<String>],
    pub copy: &'a [Spanned<String>],
    pub after: &'a [Spanned<String>],
    pub push: Option<bool>,
    pub expect_changes: Option<bool>,
}

/// The schemes `[store] url` may use.
const STORE_URL_SCHEMES: [&str; 2] = ["postgres://", "postgresql://"];

impl Lower<'_> {
    /// `[store]`: the URL is kept secret whatever wrote it, and checked
    /// without ever being quoted.
    pub(super) fn store(&mut self, raw: Option<Spanned<RawStore>>) -> StoreSettings {
        let Some(raw) = raw.map(|r| r.value) else {
            return StoreSettings::default();
        };
        let lease_timeout_secs = raw
            .lease_timeout
            .as_ref()
            .and_then(|d| self.duration(d, "lease_timeout", MAX_LEASE_TIMEOUT_SECS))
            .unwrap_or(DEFAULT_LEASE_TIMEOUT_SECS);
        let role = raw
            .role
            .as_ref()
            .map_or(FleetRole::default(), |r| self.role(r));
        let Some(url) = raw.url else {
            return StoreSettings {
                url: None,
                lease_timeout_secs,
                role,
            };
        };
        if url.is_unresolved() {
            return StoreSettings {
                url: None,
                lease_timeout_secs,
                role,
            };
        }
        if !STORE_URL_SCHEMES
            .iter()
            .any(|s| url.expose().starts_with(s))
        {
            let from = match url.source() {
                Some(source) if url.is_secret() => format!(" from `{}`", clip(source)),
                _ => String::new(),
            };
            self.error(
                &url.span,
                format!("`[store] url`{from} is not a PostgreSQL URL"),
                "write `postgres://USER:PASSWORD@HOST:PORT/DATABASE`, usually as `url = \"${NPC_STORE_URL}\"`",
            );
            return StoreSettings::default();
        }
        if !self.store_url_tls(&url) {
            return StoreSettings::default();
        }
        let url = if url.is_secret() {
            url.value
        } else {
            Text::secret(url.expose())
        };
        StoreSettings {
            url: Some(url),
            lease_timeout_secs,
            role,
        }
    }

    /// `[store] role`: one of [`FleetRole::NAMES`]; a value from the
    /// environment is named by its reference, never quoted.
    fn role(&mut self, raw: &Spanned<Text>) -> FleetRole {
        if raw.is_unresolved() {
            return FleetRole::default();
        }
        if let Some(role) = FleetRole::parse(raw.expose()) {
            return role;
        }
        let hint = format!(
            "write one of {}, such as `role = \"${{NPC_ROLE:-all}}\"` to set it per machine",
            FleetRole::NAMES.map(|n| format!("`{n}`")).join(", ")
        );
        let summary = match raw.source() {
            Some(source) if raw.is_secret() => {
                format!("`[store] role` from `{}` is not a role", clip(source))
            }
            _ => format!("unknown `[store] role` `{}`", clip(raw.expose())),
        };
        self.error(&raw.span, summary, hint);
        FleetRole::default()
    }

    /// `[store] url`'s TLS parameters ([`crate::model::store_url`]): known
    /// values only, and a certificate file named only by a URL that came
    /// whole from the environment, so a manifest (a cloned repository's)
    /// never chooses a file of the user's that npc reads. Never quotes the
    /// URL.
    fn store_url_tls(&mut self, url: &Spanned<Text>) -> bool {
        use crate::model::store_url::{RootCert, is_one_env_reference, parse};
        let from = match url.source() {
            Some(source) if url.is_secret() => format!(" from `{}`", clip(source)),
            _ => String::new(),
        };
        let parsed = match parse(url.expose()) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.error(
                    &url.span,
                    format!("`[store] url`{from}: {e}"),
                    "see docs/guide/fleet.md (TLS) for `sslmode` and `sslrootcert`",
                );
                return false;
            }
        };
        let from_environment = url.is_secret() && url.source().is_some_and(is_one_env_reference);
        if matches!(parsed.sslrootcert, Some(RootCert::File(_))) && !from_environment {
            self.error(
                &url.span,
                "`[store] url` names an `sslrootcert` file in the manifest itself; npc reads that file only when the whole URL comes from the environment, so a repository never chooses a file of yours to read",
                "write `url = \"${NPC_STORE_URL}\"` and put `sslrootcert=/path/to/ca.pem` in that variable's URL",
            );
            return false;
        }
        true
    }

    pub(super) fn runs(&mut self, raw: Option<Spanned<RawRuns>>) -> RunsSettings {
        let Some(Spanned { value: raw, .. }) = raw else {
            return RunsSettings::default();
        };
        let defaults = RunsSettings::default();
        let workspace = raw.workspace.as_ref().and_then(|w| self.workspace_mode(w));
        let worktrees_dir =
            raw.worktrees_dir.as_ref().and_then(|d| {
                if !self.relative_path(&d.span, d, "`worktrees_dir`") {
                    return None;
                }
                // A directory of its own: not the checkout itself, not git's.
                let parts: Vec<_> = Path::new(&d.value)
                    .components()
                    .filter(|c| !matches!(c, Component::CurDir))
                    .collect();
                let own = !parts.is_empty() && parts[0] != Component::Normal(".git".as_ref());
                if !own {
                    self.error(
                    &d.span,
                    format!("`worktrees_dir` `{}` is not a directory of its own", clip(d)),
                    "name a directory below the manifest's, outside `.git/`, such as `.worktrees`",
                );
                }
                own.then(|| d.value.clone())
            });
        let max_concurrent = self.bounded(
            raw.max_concurrent.as_ref(),
            "max_concurrent",
            1..=MAX_CONCURRENT_RUNS_LIMIT as u64,
            defaults.max_concurrent as u64,
            "runs",
        ) as usize;
        let max_kept_worktrees = self.bounded(
            raw.max_kept_worktrees.as_ref(),
            "max_kept_worktrees",
            0..=MAX_KEPT_WORKTREES_LIMIT as u64,
            defaults.max_kept_worktrees as u64,
            "worktrees",
        ) as usize;
        let keep_failed_secs = raw
            .keep_failed
            .as_ref()
            .and_then(|k| self.duration(k, "keep_failed", u64::MAX))
            .unwrap_or(defaults.keep_failed_secs);
        let ports = raw.ports.as_ref().and_then(|p| {
            let parsed = p
                .split_once('-')
                .and_then(|(a, b)| {
                    Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?))
                })
                .filter(|(a, b)| *a >= 1024 && a <= b);
            if parsed.is_none() {
                self.error(
                    &p.span,
                    format!("invalid port range `{}`", clip(p)),
                    "write `FIRST-LAST` with 1024 <= FIRST <= LAST <= 65535, such as `41000-41099`",
                );
            }
            parsed
        });
        let author = raw.author.as_ref().and_then(|a| {
            let ok = !a.trim().is_empty()
                && a.len() <= 200
                && !a.chars().any(char::is_control)
                && a.matches('<').count() <= 1
                && a.matches('>').count() <= 1;
            if !ok {
                self.error(
                    &a.span,
                    format!("invalid author `{}`", clip(a)),
                    "write `Name <email>` on one line, such as `Review Bot <bot@example.com>`",
                );
            }
            ok.then(|| a.value.clone())
        });
        let approval_timeout_secs = raw
            .approval_timeout
            .as_ref()
            .and_then(|d| self.duration(d, "approval_timeout", MAX_APPROVAL_TIMEOUT_SECS))
            .unwrap_or(defaults.approval_timeout_secs);
        let (sandbox, sandbox_rules) = self.runs_sandbox(raw.sandbox.as_ref());
        RunsSettings {
            sandbox,
            sandbox_rules,
            workspace,
            worktrees_dir,
            max_concurrent,
            keep_failed_secs,
            max_kept_worktrees,
            ports,
            author,
            approval_timeout_secs,
        }
    }

    fn workspace_mode(&mut self, w: &Spanned<String>) -> Option<WorkspaceMode> {
        let mode = WorkspaceMode::parse(w);
        if mode == Some(WorkspaceMode::Worktree) && self.files.is_git_repository() == Some(false) {
            self.error(
                &w.span,
                "`workspace = \"worktree\"` needs a git repository, and this directory is none",
                "run `git init` (and commit) here, or set `workspace = \"in_place\"`",
            );
        }
        if mode.is_none() {
            let hint = suggest(w, &WorkspaceMode::NAMES);
            self.error(&w.span, format!("unknown workspace `{}`", clip(w)), hint);
        }
        mode
    }

    /// A duration such as `30m` or `24h`, at most `max` seconds.
    pub(super) fn duration(&mut self, d: &Spanned<String>, field: &str, max: u64) -> Option<u64> {
        match crate::model::schedule::parse_duration(d) {
            Ok(secs) if secs > 0 && secs <= max => Some(secs),
            Ok(_) => {
                self.error(
                    &d.span,
                    format!("`{field}` `{}` is out of range", clip(d)),
                    format!("use more than 0 and at most {max} seconds"),
                );
                None
            }
            Err(e) => {
                self.error(
                    &d.span,
                    format!("invalid `{field}` `{}`: {e}", clip(d)),
                    "write a duration such as `30m`, `2h` or `1h30m`",
                );
                None
            }
        }
    }

    pub(super) fn workspace(&mut self, raw: RawWorkspace<'_>) -> WorkspaceSpec {
        let mode = raw.mode.and_then(|m| self.workspace_mode(m));
        if mode == Some(WorkspaceMode::InPlace) {
            for (field, present) in [
                ("ref", raw.base_ref.is_some()),
                ("branch", raw.branch.is_some()),
                ("setup", !raw.setup.is_empty()),
                ("copy", !raw.copy.is_empty()),
                ("after", !raw.after.is_empty()),
                ("push", raw.push.is_some()),
                ("expect_changes", raw.expect_changes.is_some()),
            ] {
                if present && let Some(m) = raw.mode {
                    self.error(
                        &m.span,
                        format!("`{field}` needs `workspace = \"worktree\"`"),
                        format!("a run in place has no worktree for `{field}`; remove it, or set `workspace = \"worktree\"`"),
                    );
                }
            }
        }
        let base_ref = raw.base_ref.map(|r| {
            self.line_template(r, "ref");
            self.literal_ref(r, "ref", crate::model::refname::ref_name_problem);
            r.value.clone()
        });
        let branch = raw.branch.map(|b| {
            self.line_template(b, "branch");
            self.literal_ref(b, "branch", crate::model::refname::branch_name_problem);
            b.value.clone()
        });
        for c in raw.copy {
            self.relative_path(&c.span, c, "a `copy` path");
        }
        for command in raw.setup.iter().chain(raw.after) {
            if command.trim().is_empty() || command.contains('\0') {
                self.error(
                    &command.span,
                    "empty command",
                    "write a shell command such as `npm ci`, or remove it",
                );
            }
        }
        WorkspaceSpec {
            mode,
            base_ref,
            branch,
            setup: raw.setup.iter().map(|s| s.value.clone()).collect(),
            copy: raw.copy.iter().map(|s| s.value.clone()).collect(),
            after: raw.after.iter().map(|s| s.value.clone()).collect(),
            push: raw.push,
            expect_changes: raw.expect_changes,
        }
    }

    /// A `ref` or `branch` without template syntax is the name every run
    /// gets: checked now as a run checks it (`problem`). A template's text
    /// before its first `{` starts every name it renders: checked with one
    /// character after it (`refs/heads/{{ run.id }}` is refused already).
    fn literal_ref(
        &mut self,
        t: &Spanned<String>,
        field: &str,
        problem: fn(&str) -> Option<String>,
    ) {
        let checked = match t.value.split_once('{') {
            None => t.value.clone(),
            Some(("", _)) => return,
            Some((prefix, _)) => format!("{prefix}x"),
        };
        if let Some(reason) = problem(&checked) {
            self.error(
                &t.span,
                format!("`{field}` `{}` is not a valid name: {reason}", clip(t)),
                match field {
                    "branch" => "name a new branch, such as `npc/{{ run.id }}`",
                    _ => "name a branch, a tag or a commit, such as `main`",
                },
            );
        }
    }

    /// A one-line template (a ref, a branch, a concurrency key): it
    /// compiles and reads only `trigger`, `payload` and `run`.
    pub(super) fn line_template(&mut self, t: &Spanned<String>, field: &str) {
        let env = self.templates.get_or_insert_with(template::environment);
        match template::compile(env, "line", t) {
            Ok(compiled) => {
                let roots: BTreeSet<String> =
                    compiled.undeclared_variables(false).into_iter().collect();
                let old = compiled
                    .undeclared_variables(true)
                    .into_iter()
                    .find(|v| v == template::OLD_PAYLOAD || v.starts_with("trigger.body."));
                if let Some(var) = old {
                    let w = template::old_payload_warning(&format!("`{field}`"), &var);
                    self.warning(
                        &t.span,
                        w.summary.clone(),
                        w.hint.clone().unwrap_or_default(),
                    );
                }
                if let Some(other) = roots
                    .iter()
                    .find(|r| !template::LINE_ROOTS.contains(&r.as_str()))
                {
                    self.error(
                        &t.span,
                        format!(
                            "`{field}` reads `{}`, which a run does not have",
                            clip(other)
                        ),
                        format!("use {}", quoted_list(&template::LINE_ROOTS)),
                    );
                }
            }
            Err(e) => self.error(
                &t.span,
                format!(
                    "`{field}` is not a valid template: {}",
                    clip(&e.to_string())
                ),
                "fix the template, such as `{{ payload.pull_request.number }}`",
            ),
        }
    }

    /// A webhook's `filter`, compiled (kept in its compiled form).
    pub(super) fn filter(&mut self, f: &Spanned<String>) -> Option<template::Filter> {
        match template::Filter::compile(f) {
            Ok(filter) => Some(filter),
            Err(e) => {
                self.error(
                    &f.span,
                    format!(
                        "`filter` is not a valid expression: {}",
                        clip(&e.to_string())
                    ),
                    "write a minijinja expression such as `payload.action == \"created\"`",
                );
                None
            }
        }
    }
}
