//! Lowering of Triggers and their actions (`[triggers.*]`).

use super::*;

impl Lower<'_> {
    pub(super) fn trigger(
        &mut self,
        Spanned { value: t, span }: Spanned<RawTrigger>,
        m: &Manifest,
        routes: &mut HashMap<String, Span>,
    ) -> Option<Trigger> {
        const KINDS: [&str; 3] = ["cron", "webhook", "file_watch"];
        let kind = t.kind.as_str();
        let fields: [(&str, bool, &[&str]); 11] = [
            ("schedule", t.schedule.is_some(), &["cron"]),
            ("filter", t.filter.is_some(), &["webhook"]),
            ("timezone", t.timezone.is_some(), &["cron"]),
            ("missed", t.missed.is_some(), &["cron"]),
            ("route", t.route.is_some(), &["webhook"]),
            ("secret_env", t.secret_env.is_some(), &["webhook"]),
            ("max_body_bytes", t.max_body_bytes.is_some(), &["webhook"]),
            (
                "rate_limit_per_minute",
                t.rate_limit_per_minute.is_some(),
                &["webhook"],
            ),
            ("paths", !t.paths.is_empty(), &["file_watch"]),
            ("ignore", !t.ignore.is_empty(), &["file_watch"]),
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
                    Ok(s) => {
                        if let Schedule::Cron(c) = &s
                            && c.has_star_step_day_corner()
                        {
                            self.warning(&expr.span, format!("cron dialects read `{}` differently", clip(&expr.value)), "npc (like Vixie cron and cronie) fires only on days matching BOTH day fields, because one starts with `*`; Python's croniter fires on days matching EITHER; write both day fields without `*` to mean either, or make one `*` to mean the other alone");
                        }
                        Some(s)
                    }
                    Err(e) => {
                        self.error(&expr.span, format!("invalid schedule `{}`: {e}", clip(&expr.value)), "write 5 crontab fields (minute hour day-of-month month day-of-week), a macro such as `@daily`, or an interval such as `15m`");
                        None
                    }
                };
                let timezone = match &t.timezone {
                    None => TimeZone::UTC,
                    Some(tz) => match tz.parse::<chrono_tz::Tz>() {
                        Ok(zone) => TimeZone(zone),
                        Err(_) => {
                            let hint = match did_you_mean(
                                tz,
                                chrono_tz::TZ_VARIANTS.iter().map(|z| z.name()),
                            ) {
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
                            TimeZone::UTC
                        }
                    },
                };
                if !t.events.is_empty() {
                    self.error(
                        &t.events[0].span,
                        "`events` does not apply to a `cron` trigger",
                        "remove it",
                    );
                }
                let missed = match &t.missed {
                    None => Missed::default(),
                    Some(m) => Missed::parse(m).unwrap_or_else(|| {
                        let hint = suggest(m, &Missed::NAMES);
                        self.error(
                            &m.span,
                            format!("unknown missed-fire policy `{}`", clip(&m.value)),
                            hint,
                        );
                        Missed::default()
                    }),
                };
                TriggerSource::Cron {
                    schedule: schedule?,
                    timezone,
                    missed,
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
                let max_body_bytes = self.bounded(
                    t.max_body_bytes.as_ref(),
                    "max_body_bytes",
                    1..=MAX_WEBHOOK_BODY_BYTES,
                    DEFAULT_WEBHOOK_MAX_BODY_BYTES,
                    "bytes",
                );
                let rate_limit_per_minute = self.bounded(
                    t.rate_limit_per_minute.as_ref(),
                    "rate_limit_per_minute",
                    1..=MAX_WEBHOOK_RATE_PER_MINUTE,
                    DEFAULT_WEBHOOK_RATE_PER_MINUTE,
                    "requests a minute",
                );
                let filter = t.filter.as_ref().and_then(|f| self.filter(f));
                TriggerSource::Webhook {
                    filter,
                    route: route.value.clone(),
                    secret_env,
                    events: t.events.iter().map(|e| e.value.clone()).collect(),
                    max_body_bytes,
                    rate_limit_per_minute,
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
                for path in t.paths.iter().chain(&t.ignore) {
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
                    ignore: t.ignore.iter().map(|p| p.value.clone()).collect(),
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
        let overlap = match &t.overlap {
            None => Overlap::default(),
            Some(o) => Overlap::parse(o).unwrap_or_else(|| {
                let hint = suggest(o, &Overlap::NAMES);
                self.error(
                    &o.span,
                    format!("unknown overlap policy `{}`", clip(&o.value)),
                    hint,
                );
                Overlap::default()
            }),
        };
        let workspace = self.workspace(super::runs::RawWorkspace {
            mode: t.workspace.as_ref(),
            base_ref: t.base_ref.as_ref(),
            branch: t.branch.as_ref(),
            setup: &t.setup,
            copy: &t.copy,
            after: &t.after,
            push: t.push,
            expect_changes: t.expect_changes,
        });
        if let Some(key) = &t.concurrency_key {
            self.line_template(key, "concurrency_key");
        }
        let timeout_secs = t
            .timeout
            .as_ref()
            .and_then(|d| self.duration(d, "timeout", MAX_RUN_TIMEOUT_SECS));
        let retries = self.bounded(
            t.retries.as_ref(),
            "retries",
            0..=u64::from(MAX_RETRIES),
            0,
            "retries",
        ) as u32;
        let approval_timeout_secs = t
            .approval_timeout
            .as_ref()
            .and_then(|d| self.duration(d, "approval_timeout", MAX_APPROVAL_TIMEOUT_SECS));
        let sandbox = t
            .sandbox
            .as_ref()
            .and_then(|m| self.sandbox_mode(&m.span, m));
        let action = self.action(t.action, m)?;
        if let (Some(raw), Action::RunCommand(_)) = (&t.sandbox, &action) {
            self.error(
                &raw.span,
                "`sandbox` applies to profile runs, and this trigger runs a command",
                "remove `sandbox`, or run the command from a profile's agent",
            );
        }
        Some(Trigger {
            sandbox,
            enabled: t.enabled.unwrap_or(true),
            source,
            action,
            overlap,
            workspace,
            concurrency_key: t.concurrency_key.map(|k| k.value),
            timeout_secs,
            retries,
            approval_timeout_secs,
        })
    }

    /// An optional whole number in `range`, else `default` (with an error
    /// naming the range when it is outside).
    pub(super) fn bounded(
        &mut self,
        value: Option<&Spanned<i64>>,
        field: &str,
        range: std::ops::RangeInclusive<u64>,
        default: u64,
        unit: &str,
    ) -> u64 {
        match value {
            None => default,
            Some(v) => match u64::try_from(v.value) {
                Ok(n) if range.contains(&n) => n,
                _ => {
                    self.error(
                        &v.span,
                        format!("`{field}` `{}` is out of range", v.value),
                        format!("use {} to {} {unit}", range.start(), range.end()),
                    );
                    default
                }
            },
        }
    }

    pub(super) fn action(
        &mut self,
        Spanned { value: a, span }: Spanned<RawAction>,
        m: &Manifest,
    ) -> Option<Action> {
        if let Some(workflow) = a.workflow {
            let other = [
                ("profile", a.profile.as_ref().map(|p| p.span.clone())),
                ("command", a.command.as_ref().map(|c| c.span.clone())),
                ("prompt", a.prompt.as_ref().map(|p| p.span.clone())),
                ("vars", a.vars.first().map(|(k, _)| k.span.clone())),
                ("args", a.args.first().map(|x| x.span.clone())),
                ("env", a.env.first().map(|(k, _)| k.span.clone())),
                ("cwd", a.cwd.as_ref().map(|c| c.span.clone())),
            ];
            for (field, at) in other {
                if let Some(at) = at {
                    self.error(
                        &at,
                        format!("an action that starts a `workflow` has no `{field}`"),
                        "the workflow's steps say what runs; remove it, or split it into two triggers",
                    );
                }
            }
            if self.reference(&workflow, "workflow", "workflows")
                && let Some(declared) = m.workflows.get(&workflow.value)
            {
                for (input, _) in &a.inputs {
                    if !declared.inputs.contains_key(&input.value) {
                        let hint =
                            match did_you_mean(input, declared.inputs.keys().map(String::as_str)) {
                                Some(best) => format!("did you mean `{best}`?"),
                                None => format!(
                                    "declare it under `[workflows.{}.inputs]`",
                                    workflow.value
                                ),
                            };
                        self.error(
                            &input.span,
                            format!(
                                "workflow `{}` has no input `{}`",
                                workflow.value, input.value
                            ),
                            hint,
                        );
                    }
                }
                for (name, declared) in &declared.inputs {
                    if declared.default.is_none() && !a.inputs.keys().any(|k| k.value == *name) {
                        self.error(
                            &workflow.span,
                            format!("workflow `{}` needs input `{name}`", clip(&workflow.value)),
                            format!("add `inputs = {{ {name} = \"…\" }}` to the action, or give the input a `default`"),
                        );
                    }
                }
            }
            return Some(Action::StartWorkflow {
                workflow: workflow.value,
                inputs: a
                    .inputs
                    .into_iter()
                    .map(|(k, v)| (k.value, v.value))
                    .collect(),
            });
        }
        if let Some((input, _)) = a.inputs.first() {
            self.error(
                &input.span,
                "`inputs` applies to actions that start a `workflow`",
                "name the workflow with `workflow = \"NAME\"`, or remove `inputs`",
            );
        }
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
                self.error(&span, "the action has neither `profile`, `command` nor `workflow`", "add `profile = \"NAME\"` to run an agent, `command = \"…\"` to run a program, or `workflow = \"NAME\"` to start a workflow");
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
}
