//! Lowering of notification sinks (`[notify.*]`): the kind and where it
//! sends (a URL checked like every endpoint, secrets from `${VAR}`), what
//! it is told (`on`, names from [`NotifyOn`]) and of which runs (trigger,
//! profile and origin filters, each a known name), and the `body`
//! template of a webhook (compiled, reading only `message`).

use super::*;

impl Lower<'_> {
    pub(super) fn notify(
        &mut self,
        name: &Spanned<String>,
        Spanned { value: n, span }: Spanned<RawNotify>,
    ) -> Option<NotifySink> {
        let kinds = ["webhook", "ntfy", "slack", "desktop"];
        let given: [(&str, Option<Span>); 7] = [
            ("url", n.url.as_ref().map(|v| v.span.clone())),
            ("topic", n.topic.as_ref().map(|v| v.span.clone())),
            ("server", n.server.as_ref().map(|v| v.span.clone())),
            ("priority", n.priority.as_ref().map(|v| v.span.clone())),
            ("token", n.token.as_ref().map(|v| v.span.clone())),
            ("body", n.body.as_ref().map(|v| v.span.clone())),
            ("headers", n.headers.keys().next().map(|k| k.span.clone())),
        ];
        // Every check runs even when the sink itself is unusable.
        let sink = match n.kind.as_str() {
            "webhook" => {
                let url = self.notify_url(name, &span, n.url.as_ref(), "webhook");
                if let Some(body) = &n.body {
                    self.notify_body(name, body);
                }
                let headers = self.http_headers(n.headers);
                url.map(|url| Sink::Webhook {
                    url,
                    headers,
                    body: n.body.map(|b| b.value),
                })
            }
            "ntfy" => {
                let url = match (&n.url, &n.topic) {
                    (Some(url), None) => {
                        if let Some(server) = &n.server {
                            self.error(
                                &server.span,
                                "`server` goes with `topic`, and this sink has a `url`",
                                "remove `server`, or replace `url` with `topic`",
                            );
                        }
                        self.notify_url(name, &span, Some(url), "ntfy")
                    }
                    (None, Some(topic)) => self.ntfy_topic(topic, n.server.as_ref()),
                    (Some(url), Some(_)) => {
                        self.error(
                            &url.span,
                            "an ntfy sink has a `url` and a `topic`",
                            "keep one: `url` (the topic's URL) or `topic` (with `server`)",
                        );
                        None
                    }
                    (None, None) => {
                        self.error(
                            &span,
                            format!(
                                "ntfy sink `{}` has neither `url` nor `topic`",
                                clip(&name.value)
                            ),
                            "add `url = \"https://ntfy.sh/TOPIC\"`, or `topic = \"TOPIC\"`",
                        );
                        None
                    }
                };
                let priority = n.priority.as_ref().map(|p| {
                    self.choice(
                        Some(p),
                        "priority",
                        |w| NtfyPriority::parse(w).map(Some),
                        &NtfyPriority::NAMES,
                    )
                });
                url.map(|url| Sink::Ntfy {
                    url,
                    priority: priority.flatten(),
                    token: n.token.map(|t| t.value),
                })
            }
            "slack" => self
                .notify_url(name, &span, n.url.as_ref(), "slack")
                .map(|url| Sink::Slack { url }),
            "desktop" => Some(Sink::Desktop),
            other => {
                let hint = suggest(other, &kinds);
                self.error(
                    &n.kind.span,
                    format!("unknown notification kind `{}`", clip(other)),
                    hint,
                );
                None
            }
        };
        let kind = n.kind.as_str();
        // Fields of another kind would be ignored: say so.
        let only = |field: &str| -> &[&str] {
            match field {
                "topic" | "server" | "priority" | "token" => &["ntfy"],
                "headers" | "body" => &["webhook"],
                _ => &["webhook", "ntfy", "slack"],
            }
        };
        for (field, at) in given {
            if let Some(at) = &at
                && kinds.contains(&kind)
                && !only(field).contains(&kind)
            {
                self.error(
                    at,
                    format!("`{field}` does not apply to a `{kind}` sink"),
                    format!("remove `{field}`; it is for {}", quoted_list(only(field))),
                );
            }
        }
        let mut on = Vec::new();
        if n.on.is_empty() {
            self.error(&span, format!("notification sink `{}` has an empty `on`", clip(&name.value)), format!("list what it is told, such as `on = [\"run.waiting\", \"run.failed\"]`; names are {}", quoted_list(&NotifyOn::NAMES)));
        }
        for word in &n.on {
            match NotifyOn::parse(word) {
                Some(o) if !on.contains(&o) => on.push(o),
                Some(_) => {}
                None => {
                    let hint = suggest(word, &NotifyOn::NAMES);
                    self.error(
                        &word.span,
                        format!("unknown `on` name `{}`", clip(&word.value)),
                        hint,
                    );
                }
            }
        }
        let mut triggers = Vec::new();
        for t in &n.triggers {
            if t.value == MANUAL_QUEUE || self.reference(t, "trigger", "triggers") {
                triggers.push(t.value.clone());
            }
        }
        let mut profiles = Vec::new();
        for p in &n.profiles {
            if self.reference(p, "profile", "profiles") {
                profiles.push(p.value.clone());
            }
        }
        let mut origins = Vec::new();
        for o in &n.origins {
            match RunOrigin::parse(o) {
                Some(origin) => origins.push(origin),
                None => {
                    let hint = suggest(o, &RunOrigin::NAMES);
                    self.error(
                        &o.span,
                        format!("unknown run origin `{}`", clip(&o.value)),
                        hint,
                    );
                }
            }
        }
        let attempts = match n.attempts {
            Some(a) if a.value < 1 || a.value as u64 > u64::from(MAX_NOTIFY_ATTEMPTS) => {
                self.error(
                    &a.span,
                    format!("`attempts` `{}` is out of range", a.value),
                    format!("use a value from 1 to {MAX_NOTIFY_ATTEMPTS}"),
                );
                DEFAULT_NOTIFY_ATTEMPTS
            }
            Some(a) => a.value as u32,
            None => DEFAULT_NOTIFY_ATTEMPTS,
        };
        let timeout_ms = self.timeout(
            n.timeout_ms,
            DEFAULT_NOTIFY_TIMEOUT_MS,
            MAX_NOTIFY_TIMEOUT_MS,
            "`timeout_ms`",
        );
        Some(NotifySink {
            sink: sink?,
            on,
            triggers,
            profiles,
            origins,
            attempts,
            timeout_ms,
            enabled: n.enabled.unwrap_or(true),
        })
    }

    /// The URL a `kind` sink must have, checked like every endpoint.
    fn notify_url(
        &mut self,
        name: &Spanned<String>,
        span: &Span,
        url: Option<&Spanned<Text>>,
        kind: &str,
    ) -> Option<Text> {
        let Some(url) = url else {
            self.error(
                span,
                format!("{kind} sink `{}` has no `url`", clip(&name.value)),
                "add `url = \"${VARIABLE}\"`, an environment variable holding the URL",
            );
            return None;
        };
        self.endpoint_url(url, "notification URL");
        Some(url.value.clone())
    }

    /// An ntfy `topic` on `server` (default [`DEFAULT_NTFY_SERVER`]) as the
    /// topic's URL; a topic is one path segment.
    fn ntfy_topic(
        &mut self,
        topic: &Spanned<Text>,
        server: Option<&Spanned<Text>>,
    ) -> Option<Text> {
        if !topic.is_unresolved()
            && (topic.expose().is_empty()
                || !topic
                    .expose()
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        {
            self.error(
                &topic.span,
                "an ntfy `topic` is letters, digits, `_` and `-`",
                "write the topic's name alone; put the server in `server`",
            );
            return None;
        }
        let (base, secret) = match server {
            Some(s) => {
                self.endpoint_url(s, "ntfy server");
                (s.expose().trim_end_matches('/').to_string(), s.is_secret())
            }
            None => (DEFAULT_NTFY_SERVER.to_string(), false),
        };
        let url = format!("{base}/{}", topic.expose());
        Some(if secret || topic.is_secret() {
            Text::secret(url)
        } else {
            Text::plain(url)
        })
    }

    /// A webhook's `body`: a template that compiles and reads only `message`.
    fn notify_body(&mut self, name: &Spanned<String>, body: &Spanned<String>) {
        let env = template::json_environment();
        match template::compile(&env, "body", body) {
            Ok(compiled) => {
                let roots: BTreeSet<String> =
                    compiled.undeclared_variables(false).into_iter().collect();
                if let Some(other) = roots
                    .iter()
                    .find(|r| !template::NOTIFY_ROOTS.contains(&r.as_str()))
                {
                    self.error(&body.span, format!("the `body` of sink `{}` reads `{}`, which a notification does not have", clip(&name.value), clip(other)), format!("use {}", quoted_list(&template::NOTIFY_ROOTS)));
                }
            }
            Err(e) => {
                let detail = e
                    .detail()
                    .map(str::to_string)
                    .unwrap_or_else(|| e.kind().to_string());
                self.error(&body.span, format!("template syntax error in the `body` of sink `{}`: {detail}", clip(&name.value)), "fix the minijinja syntax; see https://docs.rs/minijinja/latest/minijinja/syntax/");
            }
        }
    }
}
