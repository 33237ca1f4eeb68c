//! Diagnostics: every problem found while loading a manifest, with where it
//! is (file, byte span, line:column), what is wrong and what to do next.
//! Rendering is plain text like a compiler's, or the Terraform-shaped JSON
//! document `npc validate --format json` prints.

use std::fmt::{self, Write as _};

use serde::Serialize;

use super::source::{Position, SourceFile, Span};

/// How bad a diagnostic is: errors make the manifest invalid, warnings do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// A place in a source file.
#[derive(Debug, Clone)]
pub struct Location {
    pub file: SourceFile,
    pub span: Span,
}

/// One problem found in a manifest or in a file it references.
#[derive(Debug, Clone)]
pub struct Diagnostic {
    pub severity: Severity,
    /// One line, lowercase, identifiers in backticks, no trailing period.
    pub summary: String,
    /// Longer explanation, optional.
    pub detail: Option<String>,
    /// What to do next.
    pub hint: Option<String>,
    pub location: Option<Location>,
}

impl Diagnostic {
    pub fn error(summary: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            summary: summary.into(),
            detail: None,
            hint: None,
            location: None,
        }
    }

    pub fn warning(summary: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(summary)
        }
    }

    pub fn at(mut self, file: &SourceFile, span: Span) -> Self {
        self.location = Some(Location {
            file: file.clone(),
            span,
        });
        self
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// `(start, end)` positions of the location, if any.
    pub fn range(&self) -> Option<(Position, Position)> {
        let loc = self.location.as_ref()?;
        Some((
            loc.file.position(loc.span.start),
            loc.file.position(loc.span.end),
        ))
    }

    /// `file:line:column`, or just the summary's subject when there is no location.
    pub fn place(&self) -> Option<String> {
        let loc = self.location.as_ref()?;
        let start = loc.file.position(loc.span.start);
        Some(format!(
            "{}:{}:{}",
            loc.file.name(),
            start.line,
            start.column
        ))
    }
}

/// Widest source line quoted in a snippet; longer lines are cut around the caret.
pub const SNIPPET_MAX_CHARS: usize = 160;

impl fmt::Display for Diagnostic {
    /// Compiler-style rendering: header, `-->` location, the source line with a
    /// caret under the span, then detail and hint.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        writeln!(f, "{label}: {}", self.summary)?;
        if let Some(loc) = &self.location {
            let start = loc.file.position(loc.span.start);
            let end = loc.file.position(loc.span.end);
            let gutter = start.line.to_string().len();
            let pad = " ".repeat(gutter);
            writeln!(
                f,
                "{pad}--> {}:{}:{}",
                loc.file.name(),
                start.line,
                start.column
            )?;
            writeln!(f, "{pad} |")?;
            let line: Vec<char> = loc.file.line_text(start.line).chars().collect();
            // Cut very long lines to a window around the caret.
            let window_start = (start.column - 1).saturating_sub(SNIPPET_MAX_CHARS / 2);
            let window_start = window_start.min(line.len());
            let window_end = (window_start + SNIPPET_MAX_CHARS).min(line.len());
            let shown: String = line[window_start..window_end]
                .iter()
                .map(|c| {
                    if c.is_control() && *c != '\t' {
                        '\u{fffd}'
                    } else {
                        *c
                    }
                })
                .collect();
            writeln!(f, "{} | {shown}", start.line)?;
            let caret_col = (start.column - 1).saturating_sub(window_start);
            let width = if end.line == start.line {
                end.column.saturating_sub(start.column).max(1)
            } else {
                line.len().saturating_sub(start.column - 1).max(1)
            };
            let width = width.min(SNIPPET_MAX_CHARS.saturating_sub(caret_col).max(1));
            let mut marker = String::new();
            for c in line.iter().skip(window_start).take(caret_col) {
                marker.push(if *c == '\t' { '\t' } else { ' ' });
            }
            marker.push_str(&"^".repeat(width));
            writeln!(f, "{pad} | {marker}")?;
        }
        let pad = match &self.location {
            Some(loc) => " ".repeat(loc.file.position(loc.span.start).line.to_string().len()),
            None => String::new(),
        };
        if let Some(detail) = &self.detail {
            let mut text = String::new();
            for (i, l) in detail.lines().enumerate() {
                if i > 0 {
                    text.push('\n');
                }
                let _ = write!(text, "{pad} = note: {l}");
            }
            writeln!(f, "{text}")?;
        }
        if let Some(hint) = &self.hint {
            writeln!(f, "{pad} = help: {hint}")?;
        }
        Ok(())
    }
}

/// The machine-readable report, shaped like `terraform validate -json`.
#[derive(Debug, Serialize)]
pub struct JsonReport {
    pub format_version: &'static str,
    pub valid: bool,
    pub error_count: usize,
    pub warning_count: usize,
    pub diagnostics: Vec<JsonDiagnostic>,
}

#[derive(Debug, Serialize)]
pub struct JsonDiagnostic {
    pub severity: Severity,
    pub summary: String,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<JsonRange>,
}

#[derive(Debug, Serialize)]
pub struct JsonRange {
    pub filename: String,
    pub start: JsonPos,
    pub end: JsonPos,
}

#[derive(Debug, Serialize)]
pub struct JsonPos {
    pub line: usize,
    pub column: usize,
    pub byte: usize,
}

impl JsonReport {
    pub fn new(diagnostics: &[Diagnostic]) -> Self {
        let error_count = diagnostics.iter().filter(|d| d.is_error()).count();
        Self {
            format_version: "1",
            valid: error_count == 0,
            error_count,
            warning_count: diagnostics.len() - error_count,
            diagnostics: diagnostics.iter().map(JsonDiagnostic::from).collect(),
        }
    }
}

impl From<&Diagnostic> for JsonDiagnostic {
    fn from(d: &Diagnostic) -> Self {
        let mut detail = d.detail.clone().unwrap_or_default();
        if let Some(hint) = &d.hint {
            if !detail.is_empty() {
                detail.push('\n');
            }
            detail.push_str(hint);
        }
        let range = d.location.as_ref().map(|loc| {
            let pos = |byte: usize| {
                let p = loc.file.position(byte);
                JsonPos {
                    line: p.line,
                    column: p.column,
                    byte: byte.min(loc.file.text().len()),
                }
            };
            JsonRange {
                filename: loc.file.name().to_string(),
                start: pos(loc.span.start),
                end: pos(loc.span.end),
            }
        });
        Self {
            severity: d.severity,
            summary: d.summary.clone(),
            detail,
            range,
        }
    }
}

/// Sort diagnostics by file and position so output is stable.
pub fn sort(diagnostics: &mut [Diagnostic]) {
    diagnostics.sort_by(|a, b| {
        let key = |d: &Diagnostic| {
            d.location
                .as_ref()
                .map(|l| (l.file.name().to_string(), l.span.start, l.span.end))
        };
        key(a).cmp(&key(b))
    });
}

/// The closest of `candidates` to `unknown`, for "did you mean" hints.
pub fn did_you_mean<'a>(
    unknown: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    /// Minimum Jaro-Winkler similarity for a suggestion.
    const SUGGESTION_THRESHOLD: f64 = 0.8;
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(unknown, c), c))
        .filter(|(score, _)| *score >= SUGGESTION_THRESHOLD)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        assert_eq!(
            did_you_mean("comand", ["command", "args", "env"]),
            Some("command")
        );
        assert_eq!(did_you_mean("zzz", ["command", "args"]), None);
    }

    #[test]
    fn renders_caret_under_span() {
        let file = SourceFile::new("m.toml", "a = 1\ncomand = \"x\"\n");
        let d = Diagnostic::error("unknown field `comand`")
            .at(&file, 6..12)
            .with_hint("did you mean `command`?");
        let text = d.to_string();
        assert!(text.contains("--> m.toml:2:1"), "{text}");
        assert!(text.contains("2 | comand = \"x\"\n  | ^^^^^^"), "{text}");
    }
}
