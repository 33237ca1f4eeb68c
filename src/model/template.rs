//! Prompt templates at validation time: compile every template with
//! minijinja (the same environment settings `render` uses), map syntax errors
//! back to the manifest or template file, and check that a template reads
//! only the context npc provides and only variables its prompt declares.

use std::collections::BTreeSet;

use super::de::Spanned;
use super::diagnostics::Diagnostic;
use super::source::{SourceFile, Span};

/// The top-level names a template may read.
pub const CONTEXT_ROOTS: [&str; 6] = ["vars", "project", "profile", "trigger", "workspace", "run"];
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

/// A minijinja environment with npc's settings: strict undefined values,
/// trailing newlines kept, no auto-escaping (prompts are not HTML).
pub fn environment<'s>() -> minijinja::Environment<'s> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env
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

/// Check one prompt template; returns its diagnostics.
pub fn check(
    env: &minijinja::Environment<'_>,
    name: &Spanned<String>,
    template: &str,
    at: &TemplateSource,
    declared: &BTreeSet<&str>,
) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    let compiled = match env.template_from_named_str(name.as_str(), template) {
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
            return diags;
        }
    };
    let mut used: Vec<String> = compiled.undeclared_variables(true).into_iter().collect();
    used.sort();
    for var in used {
        let root = var.split('.').next().unwrap_or(&var);
        if BUILTIN_GLOBALS.contains(&root) {
            continue;
        }
        let span = find_use(template, &var).map_or_else(|| at.span(None), |r| at.span(Some(r)));
        if !CONTEXT_ROOTS.contains(&root) {
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
    diags
}

/// The byte range of the first use of dotted `var` in the template text.
fn find_use(template: &str, var: &str) -> Option<std::ops::Range<usize>> {
    template.find(var).map(|i| i..i + var.len())
}
