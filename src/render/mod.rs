//! Rendering of prompts and agent profiles with minijinja.
//!
//! Prompts and profile bodies are templates rendered in npc's environment
//! ([`crate::model::template::environment`]: strict undefined values, so a
//! missing variable is an error naming the template, line and variable).
//! A template reads the roots in [`CONTEXT_ROOTS`]: `project`, `profile`,
//! `trigger` (the firing when a trigger starts the run, looked up
//! leniently — see [`lenient`] — else none), `payload` (the request's own
//! JSON: a webhook's body, a manual firing's `--payload`; the same name
//! filters, dedupe keys and one-line templates use), `vars`
//! (declared variables: defaults overlaid with given values), `workspace`
//! (the `<workspace-context>` block, captured once per run; see
//! [`workspace`]) and `run` (run id etc., none outside a run).
//!
//! A profile renders to Markdown with YAML frontmatter (the
//! cli-agent-orchestrator agent profile format); its body is the workspace
//! block followed by its rendered prompt (unless the prompt prints the block
//! itself, where it chooses). Every output is scrubbed of
//! memory-style tags ([`scrub`]) before it is returned, so nothing stored or
//! shown carries them. Output is deterministic: the same manifest and context
//! give the same bytes.

pub mod frontmatter;
pub mod lenient;
pub mod scrub;
pub mod workspace;
pub mod yaml;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::model::template::{CONTEXT_ROOTS, RenderFailure, environment, render_bounded};
use crate::model::{Manifest, Profile, Prompt, PromptSource, Text};

pub use scrub::{SCRUBBED_TAGS, scrub};
pub use workspace::{GitHead, WorkspaceSnapshot};

/// Directory under the state dir where rendered profiles are written.
pub const PROFILES_DIR: &str = "profiles";
/// File extension of a rendered profile.
pub const PROFILE_EXTENSION: &str = "md";

/// Why rendering failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("no profile `{name}` in the manifest; known profiles: {known}")]
    UnknownProfile { name: String, known: String },
    #[error("no prompt `{name}` in the manifest; known prompts: {known}")]
    UnknownPrompt { name: String, known: String },
    #[error(
        "profile `{profile}` names {what} `{name}`, which the manifest does not define; run `npc validate` and fix the reference"
    )]
    DanglingReference {
        profile: String,
        what: &'static str,
        name: String,
    },
    #[error("prompt `{prompt}` has no variable `{variable}`; declared: {declared}")]
    UnknownVariable {
        prompt: String,
        variable: String,
        declared: String,
    },
    #[error("undefined value `{expr}` in template `{template}` line {line}; {hint}")]
    Undefined {
        template: String,
        line: usize,
        expr: String,
        hint: String,
    },
    #[error("cannot render template `{template}`{}: {detail}; fix the template (see `npc validate`)", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Template {
        template: String,
        line: Option<usize>,
        detail: String,
    },
    #[error(
        "{what} holds a secret without an environment reference; write it as `${{VAR}}` in the manifest so rendered files name the variable, not the value"
    )]
    UnreferencedSecret { what: String },
}

/// Facts about the run a render belongs to (the template value `run`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct RunInfo {
    pub id: String,
    /// The trigger that started the run, if one did.
    pub trigger: Option<String>,
    /// RFC 3339 start time.
    pub started_at: Option<String>,
}

/// Everything a render needs besides the manifest. Build one per run: the
/// workspace snapshot inside is captured at construction and reused for
/// every render through this context.
#[derive(Debug, Clone)]
pub struct RenderContext {
    workspace: WorkspaceSnapshot,
    state_dir: PathBuf,
    trigger: Option<serde_json::Value>,
    run: Option<RunInfo>,
    profile: Option<String>,
}

impl RenderContext {
    /// A context for the repository at `root` (the manifest's directory):
    /// captures the workspace snapshot now.
    pub fn new(root: &Path, manifest: &Manifest) -> Self {
        Self::from_snapshot(WorkspaceSnapshot::capture(root, manifest), manifest)
    }

    /// A context around an existing snapshot.
    pub fn from_snapshot(workspace: WorkspaceSnapshot, manifest: &Manifest) -> Self {
        let state_dir = workspace.root().join(&manifest.project.state_dir);
        Self {
            workspace,
            state_dir,
            trigger: None,
            run: None,
            profile: None,
        }
    }

    /// The trigger payload of a triggered run (the template value `trigger`).
    pub fn with_trigger(mut self, payload: serde_json::Value) -> Self {
        self.trigger = Some(payload);
        self
    }

    /// The run this render belongs to (the template value `run`).
    pub fn with_run(mut self, run: RunInfo) -> Self {
        self.run = Some(run);
        self
    }

    /// The profile a prompt is rendered for (the template value `profile`
    /// in [`prompt`]; [`profile`] always uses the profile it renders).
    pub fn with_profile(mut self, name: impl Into<String>) -> Self {
        self.profile = Some(name.into());
        self
    }

    pub fn workspace(&self) -> &WorkspaceSnapshot {
        &self.workspace
    }

    /// The absolute state directory (`project.state_dir` under the root).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }
}

/// Where the rendered profile `name` is written under `state_dir`.
pub fn profile_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir
        .join(PROFILES_DIR)
        .join(format!("{name}.{PROFILE_EXTENSION}"))
}

/// Render profile `name`: YAML frontmatter, then the workspace block and
/// the profile's prompt (rendered with its variables' defaults).
pub fn profile(
    manifest: &Manifest,
    name: &str,
    ctx: &RenderContext,
) -> Result<String, RenderError> {
    let p = manifest
        .profiles
        .get(name)
        .ok_or_else(|| RenderError::UnknownProfile {
            name: name.to_string(),
            known: crate::model::diagnostics::known_names(manifest.profiles.keys()),
        })?;
    let front = frontmatter::frontmatter(manifest, name, p)?;
    let block = ctx.workspace.block(Some(name));
    let mut out = String::with_capacity(front.len() + block.len() + 256);
    out.push_str("---\n");
    out.push_str(&front);
    out.push_str("---\n\n");
    match &p.prompt {
        None => out.push_str(block),
        Some(prompt_name) => {
            let prompt = manifest.prompts.get(prompt_name).ok_or_else(|| {
                RenderError::DanglingReference {
                    profile: name.to_string(),
                    what: "prompt",
                    name: prompt_name.clone(),
                }
            })?;
            let body = render_template(
                manifest,
                prompt_name,
                prompt,
                &BTreeMap::new(),
                ctx,
                Some(name),
                Placement::PrependWorkspace,
            )?;
            out.push_str(&body);
        }
    }
    Ok(scrub(&out))
}

/// Render prompt `name` with `vars` over its declared defaults.
pub fn prompt(
    manifest: &Manifest,
    name: &str,
    vars: &BTreeMap<String, String>,
    ctx: &RenderContext,
) -> Result<String, RenderError> {
    let prompt = manifest
        .prompts
        .get(name)
        .ok_or_else(|| RenderError::UnknownPrompt {
            name: name.to_string(),
            known: crate::model::diagnostics::known_names(manifest.prompts.keys()),
        })?;
    if let Some(profile) = &ctx.profile
        && !manifest.profiles.contains_key(profile)
    {
        return Err(RenderError::UnknownProfile {
            name: profile.clone(),
            known: crate::model::diagnostics::known_names(manifest.profiles.keys()),
        });
    }
    let out = render_template(
        manifest,
        name,
        prompt,
        vars,
        ctx,
        ctx.profile.as_deref(),
        Placement::AsWritten,
    )?;
    Ok(scrub(&out))
}

/// Render `[instructions]` (no variables, no profile; the workspace block
/// only where the template prints it): `None` when the manifest has none.
pub fn instructions(
    manifest: &Manifest,
    ctx: &RenderContext,
) -> Result<Option<String>, RenderError> {
    let Some(prompt) = &manifest.instructions else {
        return Ok(None);
    };
    let out = render_template(
        manifest,
        crate::model::INSTRUCTIONS_NAME,
        prompt,
        &BTreeMap::new(),
        ctx,
        None,
        Placement::AsWritten,
    )?;
    Ok(Some(scrub(&out)))
}

/// Where the workspace block goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// Only where the template prints `{{ workspace }}`.
    AsWritten,
    /// First (a stable prefix keeps prompt caches warm), unless the
    /// template printed `{{ workspace }}` (or `workspace.block`) itself.
    PrependWorkspace,
}

/// The name a template has in error messages: its file, or `prompts.NAME`.
pub fn template_name(name: &str, prompt: &Prompt) -> String {
    match &prompt.source {
        PromptSource::File { path } => path.clone(),
        PromptSource::Inline if name == crate::model::INSTRUCTIONS_NAME => name.to_string(),
        PromptSource::Inline => format!("prompts.{name}"),
    }
}

fn render_template(
    manifest: &Manifest,
    name: &str,
    prompt: &Prompt,
    given: &BTreeMap<String, String>,
    ctx: &RenderContext,
    profile: Option<&str>,
    placement: Placement,
) -> Result<String, RenderError> {
    let template_name = template_name(name, prompt);
    let vars = variables(name, prompt, given)?;
    let env = environment();
    let template = crate::model::template::compile(&env, &template_name, &prompt.template)
        .map_err(|e| template_error(&e, &template_name, name, &prompt.template))?;
    let mut context = BTreeMap::new();
    context.insert(CONTEXT_ROOTS[0], ser(&vars));
    context.insert(CONTEXT_ROOTS[1], project_value(manifest, ctx));
    if let Some(profile_name) = profile {
        let p = manifest
            .profiles
            .get(profile_name)
            .ok_or_else(|| RenderError::UnknownProfile {
                name: profile_name.to_string(),
                known: crate::model::diagnostics::known_names(manifest.profiles.keys()),
            })?;
        context.insert(CONTEXT_ROOTS[2], profile_value(manifest, profile_name, p)?);
    }
    // The payload is looked up leniently (see `lenient`); `trigger` itself
    // is none outside a triggered run.
    context.insert(
        CONTEXT_ROOTS[3],
        ctx.trigger
            .clone()
            .map_or_else(|| ser(&ctx.trigger), lenient::lenient),
    );
    let (workspace, printed) = ctx.workspace.value(profile);
    context.insert(CONTEXT_ROOTS[4], workspace);
    context.insert(CONTEXT_ROOTS[5], ser(&ctx.run));
    context.insert(
        CONTEXT_ROOTS[6],
        ctx.trigger.as_ref().map_or_else(
            || ser(&ctx.trigger),
            |t| lenient::lenient(crate::model::template::request_payload(t)),
        ),
    );
    let body = render_bounded(&template, minijinja::Value::from(context))
        .map_err(|f| failure_error(&f, &template_name, name, &prompt.template))?
        .text;
    Ok(match placement {
        Placement::PrependWorkspace if !printed.load(Ordering::Relaxed) => {
            let block = ctx.workspace.block(profile);
            let mut out = String::with_capacity(block.len() + 1 + body.len());
            out.push_str(block);
            if !body.is_empty() {
                out.push('\n');
                out.push_str(&body);
            }
            out
        }
        _ => body,
    })
}

/// Declared defaults overlaid with `given`; a given name that is not
/// declared is an error. Secret defaults render as their `${VAR}` spelling.
fn variables(
    prompt_name: &str,
    prompt: &Prompt,
    given: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, RenderError> {
    let mut vars = BTreeMap::new();
    for (var, decl) in &prompt.variables {
        if let Some(default) = &decl.default {
            vars.insert(
                var.clone(),
                text_out(default, || {
                    format!("default of variable `{var}` of prompt `{prompt_name}`")
                })?,
            );
        }
    }
    for (var, value) in given {
        if !prompt.variables.contains_key(var) {
            return Err(RenderError::UnknownVariable {
                prompt: prompt_name.to_string(),
                variable: var.clone(),
                declared: crate::model::diagnostics::known_names(prompt.variables.keys()),
            });
        }
        vars.insert(var.clone(), value.clone());
    }
    Ok(vars)
}

fn project_value(manifest: &Manifest, ctx: &RenderContext) -> minijinja::Value {
    let root = ctx.workspace.root();
    let name = manifest.project.name.clone().unwrap_or_else(|| {
        root.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    minijinja::context! {
        name => name,
        root => root.display().to_string(),
        state_dir => ctx.state_dir.display().to_string(),
    }
}

fn profile_value(
    manifest: &Manifest,
    name: &str,
    p: &Profile,
) -> Result<minijinja::Value, RenderError> {
    let kind = manifest
        .providers
        .get(&p.provider)
        .map(|prov| prov.kind.as_str())
        .ok_or_else(|| RenderError::DanglingReference {
            profile: name.to_string(),
            what: "provider",
            name: p.provider.clone(),
        })?;
    let model = p
        .model
        .as_ref()
        .map(|m| text_out(m, || format!("`model` of profile `{name}`")))
        .transpose()?;
    Ok(minijinja::context! {
        name => name,
        description => p.description.as_str(),
        provider => p.provider.as_str(),
        provider_kind => kind,
        model => model,
        prompt => p.prompt.as_deref(),
        mcp_servers => ser(&p.mcp_servers),
        allowed_tools => ser(&p.allowed_tools),
        denied_tools => ser(&p.denied_tools),
        skills => ser(&p.skills),
        frontmatter => ser(&p.frontmatter),
    })
}

/// A serde value as a template value.
fn ser<T: Serialize>(value: &T) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(value))
}

/// Text as it may appear in rendered output: the value when not secret,
/// the `${VAR}` spelling when secret (never the secret value).
pub(crate) fn text_out(text: &Text, what: impl FnOnce() -> String) -> Result<String, RenderError> {
    if !text.is_secret() {
        return Ok(text.shown().to_string());
    }
    text.source()
        .map(str::to_string)
        .ok_or_else(|| RenderError::UnreferencedSecret { what: what() })
}

/// Turn a minijinja error into a [`RenderError`] naming the template, line
/// and (for undefined values) the expression.
/// A bounded render failed: a bound it ran into is named as such.
fn failure_error(
    failure: &RenderFailure,
    template: &str,
    prompt_name: &str,
    source: &str,
) -> RenderError {
    match failure.exhausted {
        Some(exhausted) => RenderError::Template {
            template: failure.error.name().unwrap_or(template).to_string(),
            line: failure.error.line(),
            detail: exhausted.describe(),
        },
        None => template_error(&failure.error, template, prompt_name, source),
    }
}

/// `source` is the template's text, to name the whole expression an
/// undefined value came from.
fn template_error(
    e: &minijinja::Error,
    template: &str,
    prompt_name: &str,
    source: &str,
) -> RenderError {
    let template = e.name().unwrap_or(template).to_string();
    let detail = e
        .detail()
        .map(str::to_string)
        .unwrap_or_else(|| e.kind().to_string());
    if e.kind() == minijinja::ErrorKind::UndefinedError {
        let expr = crate::model::template::undefined_expr(&detail, source, e.line())
            .unwrap_or_else(|| "(unnamed)".to_string());
        let hint = undefined_hint(&expr, prompt_name);
        return RenderError::Undefined {
            template,
            line: e.line().unwrap_or(0),
            expr,
            hint,
        };
    }
    RenderError::Template {
        template,
        line: e.line(),
        detail,
    }
}

fn undefined_hint(expr: &str, prompt_name: &str) -> String {
    let mut parts = expr.split('.');
    let root = parts.next().unwrap_or_default();
    match root {
        "vars" => match parts.next() {
            Some(var) => format!(
                "pass `--var {var}=VALUE`, or give it a default under `[prompts.{prompt_name}.variables.{var}]`"
            ),
            None => "read a declared variable as `vars.NAME`".to_string(),
        },
        "profile" => "render the prompt for a profile (`npc render prompt NAME --profile PROFILE`)"
            .to_string(),
        "trigger" | "run" | "payload" => format!(
            "`{root}` is none unless a trigger starts the run; guard it with `{{% if {root} %}}`"
        ),
        _ => {
            "check the spelling, or guard it with `is defined` or the `default` filter".to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::DiskFiles;
    use crate::model::{McpTransport, Syntax, load_bytes};

    const MANIFEST: &str = r##"
version = 1

[project]
name = "demo"

[mcp.servers.fs]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
env = { API_TOKEN = "${API_TOKEN}", MODE = "read: only # not a comment" }
disabled_tools = ["write_file"]

[mcp.servers.search]
url = "https://mcp.example.com/mcp"
bearer_token_env = "SEARCH_TOKEN"

[providers.claude]
kind = "claude_code"

[prompts.review]
template = """
Review {{ vars.branch }} in {{ project.name }} as {{ profile.name }}.
{% if trigger %}Triggered by {{ trigger.event }}: {{ trigger.note }}{% endif %}
"""
variables.branch = { default = "main" }

[prompts.needs]
template = "first line\nsecond {{ vars.target }} line\n"
variables.target = { description = "no default" }

[prompts.placed]
template = "before\n{{ workspace }}after {{ workspace.branch }}\n"

[profiles.reviewer]
provider = "claude"
description = "Reviews: changes \"before\" merge"
prompt = "review"
model = "claude-sonnet-4-5"
mcp_servers = ["fs", "search"]
allowed_tools = ["mcp__fs__read_file", "Bash(git diff:*)"]
denied_tools = ["mcp__fs__write_file"]
skills = ["code-review"]
frontmatter = { role = "reviewer", tags = ["a", "- b"], permissionMode = "plan" }

[profiles.bare]
provider = "claude"
description = "No prompt"

[profiles.placed]
provider = "claude"
description = "Places the workspace itself"
prompt = "placed"
"##;

    fn repo(branch: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".git")).unwrap();
        set_branch(dir.path(), branch);
        dir
    }

    fn set_branch(root: &Path, branch: &str) {
        std::fs::write(
            root.join(".git/HEAD"),
            format!("ref: refs/heads/{branch}\n"),
        )
        .unwrap();
    }

    fn manifest(root: &Path) -> Manifest {
        let env: BTreeMap<String, String> =
            [("API_TOKEN".to_string(), "hunter2-secret".to_string())].into();
        let files = DiskFiles::new(root);
        let loaded = load_bytes(
            "npcagent.toml",
            MANIFEST.as_bytes(),
            Syntax::Toml,
            &env,
            &files,
        );
        loaded
            .manifest
            .unwrap_or_else(|| panic!("{:#?}", loaded.diagnostics))
    }

    fn setup() -> (tempfile::TempDir, Manifest, RenderContext) {
        let dir = repo("main");
        let m = manifest(dir.path());
        let ctx = RenderContext::new(dir.path(), &m);
        (dir, m, ctx)
    }

    #[test]
    fn undefined_variable_names_template_line_and_variable() {
        let (_dir, m, ctx) = setup();
        let err = prompt(&m, "needs", &BTreeMap::new(), &ctx).unwrap_err();
        assert_eq!(
            err,
            RenderError::Undefined {
                template: "prompts.needs".into(),
                line: 2,
                expr: "vars.target".into(),
                hint: "pass `--var target=VALUE`, or give it a default under `[prompts.needs.variables.target]`".into(),
            }
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with("undefined value `vars.target` in template `prompts.needs` line 2;"),
            "{msg}"
        );
        assert!(!msg.ends_with('.'));

        let given = BTreeMap::from([("target".to_string(), "x".to_string())]);
        assert_eq!(
            prompt(&m, "needs", &given, &ctx).unwrap(),
            "first line\nsecond x line\n"
        );
    }

    #[test]
    fn profile_is_undefined_for_a_bare_prompt() {
        let (_dir, m, ctx) = setup();
        match prompt(&m, "review", &BTreeMap::new(), &ctx).unwrap_err() {
            RenderError::Undefined {
                expr, line, hint, ..
            } => {
                // The whole expression the template reads, not only the
                // undefined root (nor `?`, as release builds once said:
                // the environment tracks where undefined values come from
                // in every build).
                assert_eq!((expr.as_str(), line), ("profile.name", 1));
                assert!(crate::model::template::environment().debug());
                assert!(hint.contains("--profile"), "{hint}");
            }
            other => panic!("{other:?}"),
        }
        let out = prompt(
            &m,
            "review",
            &BTreeMap::new(),
            &ctx.clone().with_profile("reviewer"),
        )
        .unwrap();
        assert_eq!(out, "Review main in demo as reviewer.\n\n");
    }

    #[test]
    fn given_vars_override_defaults_and_unknown_ones_fail() {
        let (_dir, m, ctx) = setup();
        let ctx = ctx.with_profile("reviewer");
        let given = BTreeMap::from([("branch".to_string(), "topic".to_string())]);
        assert!(
            prompt(&m, "review", &given, &ctx)
                .unwrap()
                .starts_with("Review topic in demo")
        );
        let bad = BTreeMap::from([("brnach".to_string(), "x".to_string())]);
        let err = prompt(&m, "review", &bad, &ctx).unwrap_err();
        assert_eq!(
            err.to_string(),
            "prompt `review` has no variable `brnach`; declared: `branch`"
        );
        assert!(matches!(
            prompt(&m, "nope", &given, &ctx),
            Err(RenderError::UnknownPrompt { .. })
        ));
        assert!(matches!(
            profile(&m, "nope", &ctx),
            Err(RenderError::UnknownProfile { .. })
        ));
    }

    #[test]
    fn trigger_and_run_are_none_unless_given() {
        let (_dir, m, ctx) = setup();
        let ctx = ctx
            .with_profile("reviewer")
            .with_trigger(
                serde_json::json!({"event": "push", "note": "<memory>private</memory>ok"}),
            )
            .with_run(RunInfo {
                id: "r1".into(),
                ..RunInfo::default()
            });
        let out = prompt(&m, "review", &BTreeMap::new(), &ctx).unwrap();
        assert_eq!(
            out,
            "Review main in demo as reviewer.\nTriggered by push: ok\n"
        );
    }

    #[test]
    fn profile_frontmatter_parses_back_in_order() {
        let (_dir, m, ctx) = setup();
        let out = profile(&m, "reviewer", &ctx).unwrap();
        let rest = out.strip_prefix("---\n").unwrap();
        let (front, body) = rest.split_once("---\n").unwrap();
        let parsed: serde_json::Value = serde_norway::from_str(front).unwrap();
        let keys: Vec<&str> = parsed
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "name",
                "description",
                "provider",
                "model",
                "mcpServers",
                "allowedTools",
                "deniedTools",
                "skills",
                "permissionMode",
                "role",
                "tags"
            ]
        );
        assert_eq!(parsed["description"], "Reviews: changes \"before\" merge");
        assert_eq!(parsed["provider"], "claude_code");
        assert_eq!(parsed["tags"], serde_json::json!(["a", "- b"]));
        let fs = &parsed["mcpServers"]["fs"];
        assert_eq!(fs["type"], "stdio");
        assert_eq!(fs["args"][2], ".");
        assert_eq!(fs["env"]["MODE"], "read: only # not a comment");
        assert_eq!(fs["timeout"], 60_000);
        let search = &parsed["mcpServers"]["search"];
        assert_eq!(search["url"], "https://mcp.example.com/mcp");
        assert_eq!(search["headers"]["Authorization"], "Bearer ${SEARCH_TOKEN}");
        assert!(body.starts_with("\n<workspace-context>\n"), "{body}");
        assert!(
            body.ends_with("</workspace-context>\n\nReview main in demo as reviewer.\n\n"),
            "{body}"
        );
    }

    #[test]
    fn secrets_render_as_references() {
        let (_dir, m, ctx) = setup();
        let out = profile(&m, "reviewer", &ctx).unwrap();
        assert!(out.contains("API_TOKEN: \"${API_TOKEN}\""), "{out}");
        assert!(!out.contains("hunter2"), "{out}");

        // A secret with no `${VAR}` spelling cannot be written at all.
        let mut m = m;
        let Some(McpTransport::Stdio(spec)) = m.mcp_servers.get_mut("fs").map(|s| &mut s.transport)
        else {
            panic!("fs is stdio");
        };
        spec.env.insert("RAW".into(), Text::secret("hunter2"));
        let err = profile(&m, "reviewer", &ctx).unwrap_err();
        assert!(
            matches!(err, RenderError::UnreferencedSecret { .. }),
            "{err}"
        );
        assert!(!err.to_string().contains("hunter2"));
    }

    #[test]
    fn rendering_is_deterministic() {
        let (dir, m, ctx) = setup();
        let a = profile(&m, "reviewer", &ctx).unwrap();
        // A fresh load and a fresh context over the same repository state.
        let ctx2 = RenderContext::new(dir.path(), &manifest(dir.path()));
        assert_eq!(a, profile(&m, "reviewer", &ctx2).unwrap());
        assert_eq!(a, profile(&m, "reviewer", &ctx).unwrap());
    }

    #[test]
    fn workspace_block_is_byte_identical_for_a_run() {
        let dir = repo("main");
        let m = manifest(dir.path());
        let ctx = RenderContext::new(dir.path(), &m);
        let first = profile(&m, "reviewer", &ctx).unwrap();
        let block = ctx.workspace().block(Some("reviewer")).to_string();
        assert!(block.contains("branch: main\n"));
        assert!(first.contains(&block));

        // The branch changes on disk mid-run: this run's renders do not.
        set_branch(dir.path(), "elsewhere");
        assert_eq!(
            profile(&m, "reviewer", &ctx).unwrap().as_bytes(),
            first.as_bytes()
        );
        assert_eq!(
            ctx.workspace().block(Some("reviewer")).as_bytes(),
            block.as_bytes()
        );

        // A new run sees the new branch.
        let next = RenderContext::new(dir.path(), &m);
        assert!(
            next.workspace()
                .block(Some("reviewer"))
                .contains("branch: elsewhere\n")
        );
    }

    #[test]
    fn workspace_block_lists_the_profile_servers_and_tools() {
        let (dir, _m, ctx) = setup();
        let root = dir.path().display();
        assert_eq!(
            ctx.workspace().block(Some("reviewer")),
            format!(
                "<workspace-context>\nrepository: {root}\nbranch: main\nmcp servers:\n\
                 - fs (stdio): all tools; not write_file\n- search (http): all tools\n\
                 allowed tools: mcp__fs__read_file, Bash(git diff:*)\n\
                 denied tools: mcp__fs__write_file\n</workspace-context>\n"
            )
        );
        assert!(
            ctx.workspace()
                .block(Some("bare"))
                .contains("mcp servers: none\n")
        );
    }

    #[test]
    fn a_template_can_place_the_workspace_itself() {
        let (_dir, m, ctx) = setup();
        let out = profile(&m, "placed", &ctx).unwrap();
        assert_eq!(out.matches("<workspace-context>").count(), 1, "{out}");
        assert!(
            out.contains("---\n\nbefore\n<workspace-context>\n"),
            "{out}"
        );
        assert!(out.ends_with("</workspace-context>\nafter main\n"), "{out}");

        // Reading a field is not placing the block: it still comes first.
        let mut m = m;
        m.prompts.get_mut("placed").unwrap().template = "on {{ workspace.branch }}\n".into();
        let out = profile(&m, "placed", &ctx).unwrap();
        assert!(out.ends_with("</workspace-context>\n\non main\n"), "{out}");

        let bare = profile(&m, "bare", &ctx).unwrap();
        assert!(bare.ends_with(&format!("---\n\n{}", ctx.workspace().block(Some("bare")))));
    }

    #[test]
    fn every_context_root_is_provided() {
        let (_dir, m, ctx) = setup();
        let ctx = ctx.with_profile("bare");
        let reads: Vec<String> = CONTEXT_ROOTS
            .iter()
            .map(|r| format!("{{{{ {r} is defined }}}}"))
            .collect();
        let mut m = m;
        m.prompts.get_mut("placed").unwrap().template = reads.join(",");
        let out = prompt(&m, "placed", &BTreeMap::new(), &ctx).unwrap();
        assert_eq!(out, vec!["True"; CONTEXT_ROOTS.len()].join(","));
    }

    #[test]
    fn output_is_scrubbed() {
        let (_dir, m, ctx) = setup();
        let mut m = m;
        m.prompts.get_mut("placed").unwrap().template =
            "a<memory>{{ project.name }}</memory>b<private>".into();
        let out = profile(&m, "placed", &ctx).unwrap();
        assert!(out.ends_with("</workspace-context>\n\nab"), "{out}");
        m.profiles.get_mut("placed").unwrap().description = "x<memory>y</memory>z".into();
        let out = profile(&m, "placed", &ctx).unwrap();
        assert!(out.contains("description: xz\n"), "{out}");
    }

    #[test]
    fn profile_paths_live_under_the_state_dir() {
        let (dir, _m, ctx) = setup();
        assert_eq!(ctx.state_dir(), dir.path().join(".npc"));
        assert_eq!(
            profile_path(ctx.state_dir(), "reviewer"),
            dir.path().join(".npc/profiles/reviewer.md")
        );
    }
}
