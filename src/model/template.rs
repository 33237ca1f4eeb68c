//! Prompt templates at validation time: compile every template with
//! minijinja (the same environment settings `render` uses), map syntax errors
//! back to the manifest or template file, and check that a template reads
//! only the context npc provides and only variables its prompt declares.
//!
//! Every render is bounded: [`TEMPLATE_FUEL`] caps the work (instructions and
//! the data a template creates, so loops, recursive macros and `"x" * 10**9`
//! all run out), and [`MAX_RENDERED_BYTES`] caps the output. Validation
//! renders each template once with an empty context ([`check`]), so a
//! template that exhausts either bound on its own is an error at its line.
//! Compiling is bounded too: every template goes through [`compile`], which
//! refuses a tag over [`MAX_TAG_TOKENS`] before minijinja's recursive code
//! generator could overflow the stack on it.

use std::collections::BTreeSet;

use super::de::Spanned;
use super::diagnostics::Diagnostic;
use super::source::{SourceFile, Span};

/// The top-level names a template may read. `payload` is the request's
/// own JSON ([`request_payload`]), the one name for it everywhere (prompts,
/// one-line templates, webhook filters, dedupe keys).
pub const CONTEXT_ROOTS: [&str; 7] = [
    "vars",
    "project",
    "profile",
    "trigger",
    "workspace",
    "run",
    "payload",
];
/// What templates once wrote for the payload: still read, with a warning.
pub const OLD_PAYLOAD: &str = "trigger.body";

/// The request's own JSON in a firing's payload: a webhook's `body`, a
/// manual firing's `payload` (`--payload`); none otherwise.
pub fn request_payload(envelope: &serde_json::Value) -> serde_json::Value {
    envelope
        .get("body")
        .or_else(|| envelope.get("payload"))
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

/// The warning for a template (`what`: "prompt `x`", "`branch`") that
/// reads the payload by its old name.
pub fn old_payload_warning(what: &str, var: &str) -> Diagnostic {
    let now = var.replacen(OLD_PAYLOAD, "payload", 1);
    Diagnostic::warning(format!(
        "{what} reads `{var}`, the old name of the payload; it still works"
    ))
    .with_hint(format!("write `{now}` instead"))
}
/// Names minijinja resolves itself.
const BUILTIN_GLOBALS: [&str; 9] = [
    "range",
    "dict",
    "namespace",
    "debug",
    "loop",
    "self",
    "super",
    "caller",
    "varargs",
];

/// Work one render may do, in minijinja fuel: about one unit per
/// instruction and per 64 bytes of data the template creates (so it also
/// bounds the memory a render allocates, to about 64 MiB). Real prompts use
/// a few thousand.
pub const TEMPLATE_FUEL: u64 = 1_000_000;
/// Fuel all validation renders of one manifest may use together: once it
/// is spent, the remaining templates are only compiled and checked (their
/// real renders stay bounded by [`TEMPLATE_FUEL`] each).
pub const MANIFEST_PROBE_FUEL: u64 = 4 * TEMPLATE_FUEL;
/// Largest output one render may produce (a prompt or a profile body).
pub const MAX_RENDERED_BYTES: usize = 1024 * 1024;

/// Most tokens one tag (`{{ … }}` or `{% … %}`) may hold. minijinja's
/// parser bounds nesting across tags and inside brackets, but chains within
/// one tag (`1~1~1…`, `x|f|f…`, `a.b.c…`, `- - - 1`, `not not …`) build a
/// tree as deep as the chain is long, which its code generator walks
/// recursively: a long enough chain overflows the thread's stack and aborts
/// the process. The tree is never deeper than the tag has tokens, and this
/// many fit in a 2 MiB thread stack (see the unit test); real tags hold a
/// few dozen.
pub const MAX_TAG_TOKENS: usize = 512;

/// The byte range of the first tag of `source` holding more than
/// [`MAX_TAG_TOKENS`] tokens, if any. Lexing stops at a lexer error (the
/// compiler reports it) and lexes in linear time, without recursion.
pub fn oversized_tag(source: &str) -> Option<std::ops::Range<usize>> {
    scan_tags(source).oversized
}

/// The globals `minijinja::Environment::new` defines (named without a
/// call, they are values there and undefined in an empty environment).
const ENV_GLOBALS: [&str; 4] = ["range", "dict", "debug", "namespace"];

/// What one pass over a template's tokens found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TagScan {
    /// See [`oversized_tag`]; lexing stops there.
    oversized: Option<std::ops::Range<usize>>,
    /// Whether the template may reach into its environment: a filter
    /// (`|`, `{% filter %}`), a test (`is`), a call (`(`: a global, a
    /// method, a macro) or a global by name ([`ENV_GLOBALS`]). One that does not renders the same in
    /// an environment without minijinja's built-ins. Lexer errors count as
    /// reaching (the compiler reports them).
    uses_builtins: bool,
}

fn scan_tags(source: &str) -> TagScan {
    use minijinja::machinery::{Token, tokenize};
    let syntax = minijinja::syntax::SyntaxConfig::default();
    let mut open: Option<(usize, usize)> = None;
    let mut uses_builtins = false;
    for item in tokenize(source, false, syntax) {
        let Ok((token, span)) = item else {
            return TagScan {
                oversized: None,
                uses_builtins: true,
            };
        };
        match token {
            Token::VariableStart | Token::BlockStart => {
                open = Some((span.start_offset as usize, 0));
            }
            Token::VariableEnd | Token::BlockEnd => open = None,
            Token::TemplateData(_) => {}
            token => {
                uses_builtins |= match token {
                    Token::Pipe | Token::ParenOpen => true,
                    Token::Ident(name) => {
                        name == "is" || name == "filter" || ENV_GLOBALS.contains(&name)
                    }
                    _ => false,
                };
                if let Some((start, count)) = open.as_mut() {
                    *count += 1;
                    if *count > MAX_TAG_TOKENS {
                        return TagScan {
                            oversized: Some(*start..span.end_offset as usize),
                            uses_builtins,
                        };
                    }
                }
            }
        }
    }
    TagScan {
        oversized: None,
        uses_builtins,
    }
}

/// What [`compile`] says of a tag over [`MAX_TAG_TOKENS`].
pub fn oversized_tag_message() -> String {
    format!(
        "a tag holds more than {MAX_TAG_TOKENS} tokens; split the expression into smaller ones (`{{% set %}}` intermediate values)"
    )
}

/// Compile `source` in `env` as the template `name`, refusing first a tag
/// too long to compile safely ([`MAX_TAG_TOKENS`]). Every template npc
/// compiles goes through here.
pub fn compile<'e, 's>(
    env: &'e minijinja::Environment<'s>,
    name: &'s str,
    source: &'s str,
) -> Result<minijinja::Template<'e, 's>, minijinja::Error> {
    if oversized_tag(source).is_some() {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::SyntaxError,
            oversized_tag_message(),
        ));
    }
    compile_sized(env, name, source)
}

/// [`compile`] of a template whose tags [`oversized_tag`] has passed.
fn compile_sized<'e, 's>(
    env: &'e minijinja::Environment<'s>,
    name: &'s str,
    source: &'s str,
) -> Result<minijinja::Template<'e, 's>, minijinja::Error> {
    env.template_from_named_str(name, source)
}

/// A minijinja environment with npc's settings: strict undefined values,
/// trailing newlines kept, no auto-escaping (prompts are not HTML), and the
/// [`TEMPLATE_FUEL`] budget per render.
pub fn environment<'s>() -> minijinja::Environment<'s> {
    configured(minijinja::Environment::new())
}

/// `env` with npc's settings (see [`environment`]).
fn configured(mut env: minijinja::Environment<'_>) -> minijinja::Environment<'_> {
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    // Undefined values remember the expression that made them, so an error
    // names it (`profile.model`), in release builds too (minijinja turns
    // this on for debug builds only).
    env.set_debug(true);
    env.set_fuel(Some(TEMPLATE_FUEL));
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env
}

/// Which bound a render ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhausted {
    /// [`TEMPLATE_FUEL`] ran out.
    Fuel,
    /// The output passed [`MAX_RENDERED_BYTES`].
    Output,
    /// The renders of one batch spent their shared pool ([`with_fuel_pool`]).
    Pool,
}

impl Exhausted {
    /// What ran out, for error messages.
    pub fn describe(self) -> String {
        match self {
            Exhausted::Fuel => format!(
                "the template ran out of its work budget ({TEMPLATE_FUEL} fuel); it loops, recurses or builds data without bound"
            ),
            Exhausted::Output => {
                format!("the template's output passed the limit of {MAX_RENDERED_BYTES} bytes")
            }
            Exhausted::Pool => format!(
                "the templates rendered together spent their shared work budget ({BATCH_FUEL} fuel); some loop, recurse or build data without bound"
            ),
        }
    }
}

/// A failed bounded render: minijinja's error (with the template's name and
/// line) and which bound, if any, it ran into.
#[derive(Debug)]
pub struct RenderFailure {
    pub error: minijinja::Error,
    pub exhausted: Option<Exhausted>,
}

/// A successful bounded render.
#[derive(Debug)]
pub struct Rendered {
    pub text: String,
    /// Fuel the render used.
    pub fuel: u64,
}

/// Fuel all renders of one batch may use together (every profile of one
/// plan of the agent files): see [`with_fuel_pool`].
pub const BATCH_FUEL: u64 = 8 * TEMPLATE_FUEL;

thread_local! {
    /// What is left of the pool set by [`with_fuel_pool`] on this thread.
    static POOL: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Run `f` with every render on this thread drawing from one pool of
/// `fuel`: many templates cannot add up to unbounded work. Once less than
/// one render's [`TEMPLATE_FUEL`] is left, renders fail at once.
pub fn with_fuel_pool<R>(fuel: u64, f: impl FnOnce() -> R) -> R {
    let previous = POOL.replace(Some(fuel));
    let result = f();
    POOL.set(previous);
    result
}

/// Charge `used` fuel to the pool, if one is set.
fn charge_pool(used: u64) {
    POOL.with(|pool| {
        if let Some(left) = pool.get() {
            pool.set(Some(left.saturating_sub(used)));
        }
    });
}

/// Render `template` with `ctx` within [`TEMPLATE_FUEL`] (set by
/// [`environment`]), [`MAX_RENDERED_BYTES`] of output, and the pool of
/// [`with_fuel_pool`] if one is set.
pub fn render_bounded(
    template: &minijinja::Template<'_, '_>,
    ctx: impl Into<minijinja::Value>,
) -> Result<Rendered, RenderFailure> {
    if POOL.get().is_some_and(|left| left < TEMPLATE_FUEL) {
        return Err(RenderFailure {
            error: minijinja::Error::new(
                minijinja::ErrorKind::OutOfFuel,
                Exhausted::Pool.describe(),
            ),
            exhausted: Some(Exhausted::Pool),
        });
    }
    let mut out = CappedWriter::default();
    match template.render_captured_to(ctx, &mut out) {
        Ok(captured) => {
            let fuel = captured
                .state()
                .fuel_levels()
                .map_or(TEMPLATE_FUEL, |(used, _)| used);
            charge_pool(fuel);
            Ok(Rendered {
                fuel,
                text: String::from_utf8_lossy(&out.bytes).into_owned(),
            })
        }
        Err(error) => {
            // What a failed render used is unknown: count all of it.
            charge_pool(TEMPLATE_FUEL);
            let exhausted = if out.overflowed {
                Some(Exhausted::Output)
            } else if error.kind() == minijinja::ErrorKind::OutOfFuel {
                Some(Exhausted::Fuel)
            } else {
                None
            };
            Err(RenderFailure { error, exhausted })
        }
    }
}

/// An output buffer that refuses to grow past [`MAX_RENDERED_BYTES`].
#[derive(Debug, Default)]
struct CappedWriter {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDERED_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("rendered output too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// npc's environment with undefined values allowed: validation renders each
/// template once without a context to find templates that exhaust a bound
/// on their own (undefined values iterate as empty and print nothing).
fn probe_environment() -> &'static minijinja::Environment<'static> {
    static PROBE: std::sync::OnceLock<minijinja::Environment<'static>> = std::sync::OnceLock::new();
    PROBE.get_or_init(|| {
        let mut env = environment();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
        env
    })
}

/// [`probe_environment`] without minijinja's built-in filters, tests and
/// functions (whose tables cost more to build than checking a prompt):
/// compiling and finding the variables a template reads do not depend on
/// them, and a template that uses none renders the same here.
fn bare_probe_environment() -> &'static minijinja::Environment<'static> {
    static BARE: std::sync::OnceLock<minijinja::Environment<'static>> = std::sync::OnceLock::new();
    BARE.get_or_init(|| {
        let mut env = configured(minijinja::Environment::empty());
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
        env
    })
}

/// Where a template's text sits, to turn template offsets into manifest spans.
#[derive(Debug, Clone)]
pub struct TemplateSource {
    file: SourceFile,
    /// Offset of the template's first byte in `file`, when the text appears
    /// there verbatim; otherwise `None` and errors point at `fallback`.
    offset: Option<usize>,
    fallback: Span,
}

impl TemplateSource {
    /// A template written inline in the manifest at `span`.
    pub fn inline(file: &SourceFile, span: &Span, text: &str) -> Self {
        let offset = file
            .text()
            .get(span.clone())
            .and_then(|s| s.find(text))
            .map(|i| span.start + i);
        Self {
            file: file.clone(),
            offset: if text.is_empty() { None } else { offset },
            fallback: span.clone(),
        }
    }

    /// A template read from its own file.
    pub fn file(name: &str, text: &str) -> Self {
        Self {
            file: SourceFile::new(name, text),
            offset: Some(0),
            fallback: 0..0,
        }
    }

    fn span(&self, range: Option<std::ops::Range<usize>>) -> Span {
        match (self.offset, range) {
            (Some(o), Some(r)) => o + r.start..o + r.end,
            (Some(o), None) => o..o,
            _ => self.fallback.clone(),
        }
    }

    fn span_of_line(&self, template: &str, line: usize) -> Span {
        let start: usize = template
            .split_inclusive('\n')
            .take(line.saturating_sub(1))
            .map(str::len)
            .sum();
        let len = template[start.min(template.len())..]
            .find('\n')
            .unwrap_or(template.len() - start.min(template.len()));
        self.span(Some(start..start + len))
    }
}

/// What [`check`] found: the diagnostics, and the variables the template
/// reads (dotted, as minijinja names them: `vars.branch`, `profile.model`).
#[derive(Debug)]
pub struct Checked {
    pub diagnostics: Vec<Diagnostic>,
    pub reads: BTreeSet<String>,
}

/// Check one prompt template; returns its diagnostics and what it reads. `probe_fuel` is
/// what is left of the manifest's [`MANIFEST_PROBE_FUEL`]. The template
/// is compiled once, in the bare probe environment: its syntax and the
/// variables it reads depend neither on how undefined values behave nor on
/// the built-ins; one that uses built-ins is compiled again with them for
/// its probe render.
pub fn check(
    name: &Spanned<String>,
    template: &str,
    at: &TemplateSource,
    declared: &BTreeSet<&str>,
    probe_fuel: &mut u64,
) -> Checked {
    let mut diags = Vec::new();
    let scan = scan_tags(template);
    if let Some(range) = scan.oversized {
        diags.push(
            Diagnostic::error(format!(
                "template syntax error in prompt `{}`: {}",
                name.value,
                oversized_tag_message()
            ))
            .at(&at.file, at.span(Some(range)))
            .with_hint(
                "fix the minijinja syntax; see https://docs.rs/minijinja/latest/minijinja/syntax/",
            ),
        );
        return Checked {
            diagnostics: diags,
            reads: BTreeSet::new(),
        };
    }
    let compiled = match compile_sized(bare_probe_environment(), name.as_str(), template) {
        Ok(t) => t,
        Err(e) => {
            let span = match (e.range(), e.line()) {
                (Some(r), _) => at.span(Some(r)),
                (None, Some(line)) => at.span_of_line(template, line),
                _ => at.span(None),
            };
            let detail = e
                .detail()
                .map(str::to_string)
                .unwrap_or_else(|| e.kind().to_string());
            diags.push(
                Diagnostic::error(format!("template syntax error in prompt `{}`: {detail}", name.value))
                    .at(&at.file, span)
                    .with_hint("fix the minijinja syntax; see https://docs.rs/minijinja/latest/minijinja/syntax/"),
            );
            return Checked {
                diagnostics: diags,
                reads: BTreeSet::new(),
            };
        }
    };
    let probed = if scan.uses_builtins {
        compile_sized(probe_environment(), name.as_str(), template)
            .ok()
            .and_then(|full| probe(&full, name, template, at, probe_fuel))
    } else {
        probe(&compiled, name, template, at, probe_fuel)
    };
    diags.extend(probed);
    let reads: BTreeSet<String> = compiled.undeclared_variables(true).into_iter().collect();
    for var in &reads {
        let root = var.split('.').next().unwrap_or(var);
        if BUILTIN_GLOBALS.contains(&root) {
            continue;
        }
        let span = find_use(template, var).map_or_else(|| at.span(None), |r| at.span(Some(r)));
        if var == OLD_PAYLOAD || var.starts_with("trigger.body.") {
            diags.push(
                old_payload_warning(&format!("prompt `{}`", name.value), var).at(&at.file, span),
            );
        } else if !CONTEXT_ROOTS.contains(&root) {
            diags.push(
                Diagnostic::error(format!(
                    "prompt `{}` reads `{var}`, which npc does not provide",
                    name.value
                ))
                .at(&at.file, span)
                .with_hint(format!(
                    "templates read `vars.NAME` for declared variables, or {}",
                    CONTEXT_ROOTS[1..]
                        .iter()
                        .map(|r| format!("`{r}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            );
        } else if root == "vars" {
            let Some(var_name) = var.split('.').nth(1) else {
                continue;
            };
            if !declared.contains(var_name) {
                diags.push(
                    Diagnostic::error(format!(
                        "prompt `{}` uses undeclared variable `{var_name}`",
                        name.value
                    ))
                    .at(&at.file, span)
                    .with_hint(format!(
                        "declare it: `[prompts.{}.variables.{var_name}]`",
                        name.value
                    )),
                );
            }
        }
    }
    Checked {
        diagnostics: diags,
        reads,
    }
}

/// Render the template once with no context; a bound it exhausts on its
/// own is an error at the line where it ran out. Other render errors depend
/// on the context a real render has, so they are not reported here.
fn probe(
    compiled: &minijinja::Template<'_, '_>,
    name: &Spanned<String>,
    template: &str,
    at: &TemplateSource,
    probe_fuel: &mut u64,
) -> Option<Diagnostic> {
    if *probe_fuel < TEMPLATE_FUEL {
        return None;
    }
    let failure = match render_bounded(compiled, minijinja::Value::UNDEFINED) {
        Ok(rendered) => {
            *probe_fuel -= rendered.fuel.min(*probe_fuel);
            return None;
        }
        Err(failure) => {
            // What a failed render used is unknown: count all of it.
            *probe_fuel -= TEMPLATE_FUEL;
            failure
        }
    };
    let exhausted = failure.exhausted?;
    let span = match failure.error.line() {
        Some(line) => at.span_of_line(template, line),
        None => at.span(None),
    };
    Some(
        Diagnostic::error(format!(
            "prompt `{}` cannot be rendered: {}",
            name.value,
            exhausted.describe()
        ))
        .at(&at.file, span)
        .with_hint("bound the loops and recursion in the template, and keep its output small"),
    )
}

/// The expression an undefined value came from, as the template wrote it on
/// line `line`: `expr` (what minijinja names, such as `profile`) followed by
/// the attributes the template reads of it at its first use there
/// (`profile.model`). `None`
/// when minijinja named none.
pub fn undefined_expr(detail: &str, template: &str, line: Option<usize>) -> Option<String> {
    let end = detail.find("` is undefined")?;
    let start = detail[..end].rfind('`')? + 1;
    let expr = &detail[start..end];
    let text = line
        .and_then(|l| template.lines().nth(l.checked_sub(1)?))
        .unwrap_or("");
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let first = text
        .match_indices(expr)
        .filter(|(at, _)| !text[..*at].ends_with(|c: char| word(c) || c == '.'))
        .map(|(at, _)| {
            let rest = &text[at + expr.len()..];
            let mut len = 0;
            while let Some(attr) = rest[len..].strip_prefix('.') {
                let name = attr.len() - attr.trim_start_matches(word).len();
                if name == 0 {
                    break;
                }
                len += 1 + name;
            }
            &text[at..at + expr.len() + len]
        })
        .next();
    Some(first.unwrap_or(expr).to_string())
}

/// One place a prompt is rendered, as validation probes it ([`check_use`]):
/// which context roots are there. `vars` and `project` and `workspace` are
/// always there; `trigger` and `run` are none when absent, `profile` is
/// undefined.
#[derive(Debug, Clone)]
pub struct PromptUse {
    /// How a diagnostic names it: "the `/review` command", "profile `dev`".
    pub what: String,
    /// A profile renders it (`profile`).
    pub profile: bool,
    /// A trigger's payload is there (`trigger`).
    pub trigger: bool,
    /// It renders inside a run (`run`).
    pub run: bool,
    /// The variables given a value there (defaults and given ones).
    pub vars: BTreeSet<String>,
}

impl PromptUse {
    /// Whether a template that reads `reads` (as [`Checked::reads`] names
    /// them) reads something this use may not have: `profile` without a
    /// profile, an attribute of `trigger` or `run` where they are none, a
    /// variable without a value. Only then can its probe find anything.
    pub fn lacks(&self, reads: &BTreeSet<String>) -> bool {
        reads.iter().any(|var| {
            let mut parts = var.split('.');
            let root = parts.next().unwrap_or_default();
            let attr = parts.next();
            match root {
                "profile" => !self.profile,
                "trigger" => !self.trigger && attr.is_some(),
                "run" => !self.run && attr.is_some(),
                "vars" => attr.is_some_and(|v| !self.vars.contains(v)),
                _ => false,
            }
        })
    }
}

/// A context value whose every attribute is there, for [`check_use`]: the
/// probe asks which roots a use has, not what they hold. True in an `if`
/// (the guarded text is probed too), empty when iterated or printed.
#[derive(Debug)]
struct Present;

impl minijinja::value::Object for Present {
    fn repr(self: &std::sync::Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Plain
    }

    fn get_value(self: &std::sync::Arc<Self>, _key: &minijinja::Value) -> Option<minijinja::Value> {
        Some(minijinja::Value::from_object(Present))
    }

    fn enumerate(self: &std::sync::Arc<Self>) -> minijinja::value::Enumerator {
        minijinja::value::Enumerator::Empty
    }

    fn is_true(self: &std::sync::Arc<Self>) -> bool {
        true
    }

    fn render(self: &std::sync::Arc<Self>, _f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}

/// Render the prompt `name` (whose text is `template`, at `at`) once as
/// `used` renders it; an undefined value there is an error naming the use
/// and the expression. Other failures depend on values the probe does not
/// have, so they are left to the real render. `probe_fuel` as in [`check`].
pub fn check_use(
    name: &str,
    template: &str,
    at: &TemplateSource,
    used: &PromptUse,
    probe_fuel: &mut u64,
) -> Option<Diagnostic> {
    if *probe_fuel < TEMPLATE_FUEL {
        return None;
    }
    let env = environment();
    let compiled = compile(&env, name, template).ok()?;
    let present = || minijinja::Value::from_object(Present);
    let none = minijinja::Value::from(());
    let vars: std::collections::BTreeMap<&str, &str> =
        used.vars.iter().map(|v| (v.as_str(), "")).collect();
    let mut ctx = std::collections::BTreeMap::new();
    ctx.insert(
        CONTEXT_ROOTS[0],
        minijinja::Value::from(minijinja::value::Serde(&vars)),
    );
    ctx.insert(CONTEXT_ROOTS[1], present());
    if used.profile {
        ctx.insert(CONTEXT_ROOTS[2], present());
    }
    ctx.insert(
        CONTEXT_ROOTS[3],
        if used.trigger {
            present()
        } else {
            none.clone()
        },
    );
    ctx.insert(CONTEXT_ROOTS[4], present());
    ctx.insert(
        CONTEXT_ROOTS[5],
        if used.run { present() } else { none.clone() },
    );
    ctx.insert(
        CONTEXT_ROOTS[6],
        if used.trigger { present() } else { none },
    );
    let failure = match render_bounded(&compiled, minijinja::Value::from(ctx)) {
        Ok(rendered) => {
            *probe_fuel -= rendered.fuel.min(*probe_fuel);
            return None;
        }
        Err(failure) => {
            *probe_fuel -= TEMPLATE_FUEL;
            failure
        }
    };
    if failure.error.kind() != minijinja::ErrorKind::UndefinedError {
        return None;
    }
    let line = failure.error.line();
    let expr = failure
        .error
        .detail()
        .and_then(|d| undefined_expr(d, template, line))
        .unwrap_or_else(|| "a value".to_string());
    let root = expr.split(['.', '[']).next().unwrap_or_default();
    let hint = match root {
        "profile" => format!(
            "`profile` is undefined where no profile renders the prompt: guard it with `{{% if profile is defined %}}`, or do not use prompt `{name}` there"
        ),
        "trigger" | "run" | "payload" => format!(
            "`{root}` is none unless a trigger starts the run; guard it with `{{% if {root} %}}`"
        ),
        "vars" => format!(
            "give the variable a default under `[prompts.{name}.variables]`, or guard it with `is defined`"
        ),
        _ => "guard it with `is defined` or the `default` filter".to_string(),
    };
    let span = match line {
        Some(line) => at.span_of_line(template, line),
        None => at.span(None),
    };
    Some(
        Diagnostic::error(format!(
            "prompt `{name}` cannot be rendered for {}: `{expr}` is undefined there",
            used.what
        ))
        .at(&at.file, span)
        .with_hint(hint),
    )
}

/// The byte range of the first use of dotted `var` in the template text.
fn find_use(template: &str, var: &str) -> Option<std::ops::Range<usize>> {
    template.find(var).map(|i| i..i + var.len())
}

/// The names a one-line template of a run may read (`ref`, `branch`,
/// `concurrency_key`): the firing's payload as prompts see it (`trigger`),
/// the request's own JSON (`payload`: a webhook's body, a manual firing's
/// `--payload`), and the run (`run.id`).
pub const LINE_ROOTS: [&str; 3] = ["trigger", "payload", "run"];
/// Longest a one-line template's output may be.
pub const MAX_LINE_BYTES: usize = 1024;

/// Render the one-line template `source` with `ctx` (bounded like every
/// render); the text trimmed, or why it failed.
pub fn render_line(source: &str, ctx: minijinja::Value) -> Result<String, String> {
    let env = environment();
    let template = compile(&env, "line", source).map_err(|e| e.to_string())?;
    let rendered = render_bounded(&template, ctx).map_err(|f| match f.exhausted {
        Some(bound) => bound.describe(),
        None => f.error.to_string(),
    })?;
    let text = rendered.text.trim();
    if text.len() > MAX_LINE_BYTES || text.contains('\n') {
        return Err(format!(
            "it rendered more than one line of at most {MAX_LINE_BYTES} bytes"
        ));
    }
    Ok(text.to_string())
}

/// The one name a notification's `body` template reads: the message
/// (`notify::Message`).
pub const NOTIFY_ROOTS: [&str; 1] = ["message"];

/// An [`environment`] whose `{{ … }}` write each value as JSON (a
/// notification's `body`): text from a run or a payload is data, written
/// as a JSON string, never template source and never able to end the
/// string it sits in.
pub fn json_environment<'s>() -> minijinja::Environment<'s> {
    let mut env = environment();
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::Json);
    env
}

/// Compile a webhook's `filter` expression in `env`, refusing an
/// oversized one first (see [`MAX_TAG_TOKENS`]).
pub fn compile_filter<'e, 's>(
    env: &'e minijinja::Environment<'s>,
    source: &'s str,
) -> Result<minijinja::Expression<'e, 's>, minijinja::Error> {
    if oversized_tag(&format!("{{{{ {source} }}}}")).is_some() {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::SyntaxError,
            oversized_tag_message(),
        ));
    }
    env.compile_expression(source)
}

/// The name of a [`Filter`]'s one template.
const FILTER_TEMPLATE: &str = "filter";

/// A webhook's `filter`, checked and compiled once at load and kept
/// compiled: every delivery evaluates it without parsing it again. Lookups
/// are lenient (a missing key is undefined, which is false) and an
/// evaluation is bounded by [`TEMPLATE_FUEL`]. It compares, hashes and
/// serializes as its source, as the manifest spells it.
#[derive(Clone)]
pub struct Filter {
    source: String,
    env: std::sync::Arc<minijinja::Environment<'static>>,
}

impl Filter {
    /// Compile `source`, an expression (refused when it is not one, or is
    /// oversized: [`compile_filter`]'s errors).
    pub fn compile(source: &str) -> Result<Self, minijinja::Error> {
        let mut env = environment();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
        compile_filter(&env, source)?;
        // Checked as one expression above, so the tag holds exactly it.
        env.add_template_owned(
            FILTER_TEMPLATE,
            format!("{{% if ({source}) %}}1{{% endif %}}"),
        )?;
        Ok(Self {
            source: source.to_string(),
            env: std::sync::Arc::new(env),
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the filter is true of `ctx`; an error is the reason.
    pub fn matches(&self, ctx: minijinja::Value) -> Result<bool, String> {
        self.env
            .get_template(FILTER_TEMPLATE)
            .and_then(|t| t.render(ctx))
            .map(|text| text == "1")
            .map_err(|e| e.to_string())
    }
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Filter").field(&self.source).finish()
    }
}

impl PartialEq for Filter {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Filter {}

impl std::hash::Hash for Filter {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.source.hash(state);
    }
}

impl serde::Serialize for Filter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compiled_filter_decides_like_the_expression() {
        let ctx = |action: &str| {
            let json = serde_json::json!({
                "payload": {"action": action, "n": 3, "s": "%} {{"},
                "event": "issues",
            });
            minijinja::Value::from(minijinja::value::Serde(&json))
        };
        let f = Filter::compile("payload.action == \"created\" and event == \"issues\"").unwrap();
        assert_eq!(f.matches(ctx("created")), Ok(true));
        assert_eq!(f.matches(ctx("closed")), Ok(false));
        // Missing keys are undefined, which is false; a string holding tag
        // text is data, not template.
        let f = Filter::compile("payload.missing.deeper").unwrap();
        assert_eq!(f.matches(ctx("created")), Ok(false));
        let f = Filter::compile("payload.s == \"%} {{\"").unwrap();
        assert_eq!(f.matches(ctx("created")), Ok(true));
        // Not one expression: refused at compile time.
        for bad in [
            "1 %}{% for x in y %}",
            "a b",
            "payload.action ==",
            "1) %}2{% if (1",
        ] {
            assert!(Filter::compile(bad).is_err(), "{bad}");
        }
        // Bounded like every template: an endless evaluation runs out of fuel.
        let f = Filter::compile("range(1000000) | list | length > 0").unwrap();
        assert!(f.matches(ctx("created")).is_err());
    }

    #[test]
    fn a_template_without_built_ins_probes_the_same_in_the_bare_environment() {
        let plain = [
            "plain text, no tags",
            "Review {{ vars.branch }} in {{ project.name }}.\n",
            "{% if trigger %}issue {{ trigger.issue.number }}{% else %}none{% endif %}",
            "{% for x in vars.items %}{{ loop.index }}{{ x }}{% endfor %}",
            "{% set n = 3 %}{{ n * 2 ~ 'x' }}{% for a in [1, 2, 3] %}{{ a + n }}{% endfor %}",
            "{% for a in [1,2,3,4,5,6,7,8] %}{% for b in [1,2,3,4,5,6,7,8] %}{{ a * b }}{% endfor %}{% endfor %}",
            "{{ 'a' if vars.x else 'b' }}{# a comment #}{% raw %}{{ kept }}{% endraw %}",
        ];
        for source in plain {
            let scan = scan_tags(source);
            assert!(!scan.uses_builtins, "{source}");
            let bare = compile_sized(bare_probe_environment(), "t", source).unwrap();
            let full = compile_sized(probe_environment(), "t", source).unwrap();
            let (b, f) = (
                render_bounded(&bare, minijinja::Value::UNDEFINED).unwrap(),
                render_bounded(&full, minijinja::Value::UNDEFINED).unwrap(),
            );
            assert_eq!((b.text, b.fuel), (f.text, f.fuel), "{source}");
            assert_eq!(
                bare.undeclared_variables(true),
                full.undeclared_variables(true),
                "{source}"
            );
        }
        for source in [
            "{{ x|upper }}",
            "{% filter upper %}x{% endfilter %}",
            "{% if x is defined %}y{% endif %}",
            "{% for i in range(10) %}{% endfor %}",
            "{{ x.items() }}",
            "{% for i in range %}{% endfor %}",
            "{{ namespace }}",
            "{{ 'an unterminated string }}",
        ] {
            assert!(scan_tags(source).uses_builtins, "{source}");
        }
    }

    /// Stack of tokio's blocking threads and of most threads npc renders on.
    const SMALL_STACK: usize = 2 * 1024 * 1024;

    /// Tags at the limit, in every shape that nests without brackets.
    fn chains(tokens: usize) -> Vec<String> {
        let n = (tokens - 1) / 2;
        vec![
            format!("{{{{ 1{} }}}}", "~1".repeat(n)),
            format!("{{{{ 1{} }}}}", "|upper".repeat(n)),
            format!("{{{{ x{} }}}}", ".a".repeat(n)),
            format!("{{{{ x{} }}}}", "[0]".repeat((tokens - 1) / 3)),
            format!("{{{{ {}1 }}}}", "-".repeat(tokens - 1)),
            format!("{{{{ {}1 }}}}", "not ".repeat(tokens - 1)),
            format!("{{{{ f{} }}}}", "()".repeat(n)),
        ]
    }

    #[test]
    fn tags_at_the_token_limit_compile_and_render_on_a_small_stack() {
        std::thread::Builder::new()
            .stack_size(SMALL_STACK)
            .spawn(|| {
                let env = environment();
                for source in chains(MAX_TAG_TOKENS) {
                    assert_eq!(oversized_tag(&source), None, "{source:.40}");
                    if let Ok(t) = compile(&env, "t", &source) {
                        let _ = render_bounded(&t, minijinja::Value::UNDEFINED);
                    }
                }
            })
            .unwrap()
            .join()
            .expect("no stack overflow at the limit");
    }

    #[test]
    fn a_tag_over_the_token_limit_is_refused_before_compiling() {
        let env = environment();
        for source in chains(100_000) {
            let range = oversized_tag(&source).expect("oversized");
            assert_eq!(range.start, 0);
            let err = compile(&env, "t", &source).map(drop).unwrap_err();
            assert_eq!(err.kind(), minijinja::ErrorKind::SyntaxError);
        }
        let text = format!(
            "{} {{{{ 1 }}}} {{% if x %}}y{{% endif %}}",
            "a".repeat(100_000)
        );
        assert_eq!(oversized_tag(&text), None, "template data does not count");
    }
}
