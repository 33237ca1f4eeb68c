//! Lowering of MCP servers and the built-in tool settings (`[mcp]`, `[mcp.servers.*]`, `[mcp.builtins]`).

use super::*;

impl Lower<'_> {
    pub(super) fn mcp_builtins(&mut self, raw: Option<Spanned<RawMcpBuiltins>>) -> McpBuiltins {
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

    pub(super) fn mcp_server(
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
                self.endpoint_url(&url, "MCP server URL");
                let headers = self.http_headers(s.headers);
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
        if let McpTransport::Stdio(spec) = &transport {
            self.no_plugin_placeholders(name, spec);
        }
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

    /// A manifest server belongs to no plugin: `${PLUGIN_ROOT}` and
    /// `${PLUGIN_DATA}` (kept as written by interpolation) mean nothing here.
    fn no_plugin_placeholders(&mut self, name: &Spanned<String>, spec: &CommandSpec) {
        let values = spec
            .args
            .iter()
            .chain(spec.env.values())
            .chain(spec.cwd.iter());
        for v in values {
            if let Some(p) = crate::model::interp::PLUGIN_PLACEHOLDERS
                .iter()
                .find(|p| v.expose().contains(&format!("${{{p}}}")))
            {
                self.error(
                    &name.span,
                    format!("MCP server `{}` uses `${{{p}}}`, which only a plugin's own servers and hooks have", clip(&name.value)),
                    "declare the server in a plugin package's `mcp.json`, or use a path relative to the manifest",
                );
                return;
            }
        }
    }
}

impl Lower<'_> {
    /// An endpoint npc connects to ([`check_url`]); `what` names it in the
    /// message (`MCP server URL`). The rules hold for a URL from the
    /// environment too; then the message names the reference, never the
    /// value.
    pub(super) fn endpoint_url(&mut self, url: &Spanned<Text>, what: &str) {
        if !url.is_unresolved()
            && let Err(problem) = check_url(url.expose())
        {
            let summary = match (url.is_secret(), url.source()) {
                (true, Some(source)) => format!(
                    "invalid {what} from `{}`: {}",
                    clip(source),
                    problem.describe(UrlShown::Redacted)
                ),
                (true, None) => format!("invalid {what}: {}", problem.describe(UrlShown::Redacted)),
                (false, _) => format!("invalid {what}: {}", problem.describe(UrlShown::Value)),
            };
            self.error(
                &url.span,
                summary,
                "use `https://host/path`, or `http://` on loopback only",
            );
        }
    }

    /// HTTP headers sent to an endpoint: valid names, none twice (ignoring
    /// case), one-line values (never quoted: they may be secrets).
    pub(super) fn http_headers(&mut self, raw: TextMap) -> BTreeMap<String, Text> {
        let mut headers = BTreeMap::new();
        let mut seen: HashMap<String, Span> = HashMap::new();
        for (key, value) in raw {
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
        headers
    }
}
