//! Lowering of Agent providers, prompt templates and profiles (`[providers.*]`, `[prompts.*]`, `[profiles.*]`).

use super::*;

impl Lower<'_> {
    pub(super) fn provider(
        &mut self,
        Spanned { value: p, .. }: Spanned<RawProvider>,
    ) -> Option<Provider> {
        let Some(kind) = ProviderKind::parse(&p.kind) else {
            let hint = suggest(&p.kind, &ProviderKind::NAMES);
            self.error(
                &p.kind.span,
                format!("unknown provider kind `{}`", clip(&p.kind.value)),
                hint,
            );
            return None;
        };
        let driver = match &p.driver {
            None => ProviderDriver::default(),
            Some(word) => ProviderDriver::parse(word).unwrap_or_else(|| {
                let hint = suggest(word, &ProviderDriver::NAMES);
                self.error(
                    &word.span,
                    format!("unknown provider driver `{}`", clip(word)),
                    hint,
                );
                ProviderDriver::default()
            }),
        };
        // Without a `command`, the CLI's usual program: for `acp` its ACP
        // program, whose arguments come before the user's.
        let mut args: Vec<Text> = Vec::new();
        let command = match p.command {
            Some(c) => c,
            None => {
                let program = match driver {
                    ProviderDriver::Headless => kind.default_command(),
                    ProviderDriver::Acp => {
                        let (program, fixed) = kind.default_acp_command();
                        args.extend(fixed.iter().map(|a| Text::plain(*a)));
                        program
                    }
                };
                Spanned {
                    span: p.kind.span.clone(),
                    value: program.to_string(),
                }
            }
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
        args.extend(p.args.into_iter().map(|a| a.value));
        Some(Provider {
            kind,
            driver,
            command,
            args,
            env: self.env_map(p.env),
            version: p.version.map(|v| v.value),
        })
    }

    pub(super) fn prompt(
        &mut self,
        name: &Spanned<String>,
        Spanned { value: p, span }: Spanned<RawPrompt>,
    ) -> Option<Located<Prompt>> {
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
        let found = template::check(
            name,
            &template,
            &template_file,
            &declared,
            &mut self.probe_fuel,
        );
        // Only a template without errors is probed in its uses (`uses`).
        let located = (!found.diagnostics.iter().any(Diagnostic::is_error))
            .then_some((template_file, found.reads));
        self.diags.extend(found.diagnostics);
        if let Some(d) = &p.description
            && d.value.trim().is_empty()
        {
            self.error(
                &d.span,
                "empty prompt `description`",
                "say what the prompt does, or remove `description`",
            );
        }
        Some((
            Prompt {
                source,
                template,
                variables,
                command: p.command.unwrap_or(false),
                description: p.description.map(|d| d.value),
            },
            located,
        ))
    }

    /// `[instructions]`: lowered as a prompt without variables (same
    /// template checks, same file rules).
    pub(super) fn instructions(
        &mut self,
        Spanned { value, span }: Spanned<RawInstructions>,
    ) -> Option<Located<Prompt>> {
        let name = Spanned {
            span: span.clone(),
            value: INSTRUCTIONS_NAME.to_string(),
        };
        let raw = RawPrompt {
            template: value.template,
            file: value.file,
            variables: Default::default(),
            command: None,
            description: None,
        };
        self.prompt(&name, Spanned { value: raw, span })
    }

    pub(super) fn profile(
        &mut self,
        Spanned { value: p, .. }: Spanned<RawProfile>,
    ) -> Option<Profile> {
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
        for pattern in &p.ask_tools {
            if let Err(e) = crate::model::pattern::ToolPattern::parse(pattern) {
                self.error(
                    &pattern.span,
                    format!("`ask_tools` pattern `{}`: {e}", clip(pattern)),
                    "write `NAME` or `NAME(SUBJECT)`, such as `Bash`, `mcp__fs__*` or `Bash(git push:*)`",
                );
            }
        }
        let workspace = self.workspace(super::runs::RawWorkspace {
            mode: p.workspace.as_ref(),
            base_ref: p.base_ref.as_ref(),
            branch: p.branch.as_ref(),
            setup: &p.setup,
            copy: &p.copy,
            after: &p.after,
            push: p.push,
            expect_changes: p.expect_changes,
        });
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
        let approval_timeout_secs = p
            .approval_timeout
            .as_ref()
            .and_then(|d| self.duration(d, "approval_timeout", MAX_APPROVAL_TIMEOUT_SECS));
        let sandbox = p
            .sandbox
            .as_ref()
            .and_then(|m| self.sandbox_mode(&m.span, m));
        Some(Profile {
            sandbox,
            provider: p.provider.value,
            description: p.description.value,
            prompt: p.prompt.map(|v| v.value),
            mcp_servers: p.mcp_servers.into_iter().map(|v| v.value).collect(),
            allowed_tools: p.allowed_tools.into_iter().map(|v| v.value).collect(),
            denied_tools: p.denied_tools.into_iter().map(|v| v.value).collect(),
            ask_tools: p.ask_tools.into_iter().map(|v| v.value).collect(),
            model: p.model.map(|v| v.value),
            skills: p.skills.into_iter().map(|v| v.value).collect(),
            frontmatter: Frontmatter(frontmatter),
            workspace,
            approval_timeout_secs,
        })
    }
}
