//! Diagnostics: every problem found while loading a manifest, with where it
//! is (file, byte span, line:column), what is wrong and what to do next.
//! Rendering is plain text like a compiler's, or the Terraform-shaped JSON
//! document `npc validate --format json` prints.

use std::fmt::{self, Write as _};

use serde::Serialize;

use super::source::{Position, SourceFile, Span, floor_char_boundary};

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

/// Longest value quoted inside a message (a key, a name, a string from the
/// manifest); [`clip`] cuts longer ones to a prefix ending in `…`.
pub const MAX_QUOTED_CHARS: usize = 64;
/// Longest summary, detail or hint, in bytes; longer text is cut to a prefix
/// ending in `…`. With [`MAX_DIAGNOSTICS`] this bounds a whole report.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `names` as an error message lists the known ones: quoted,
/// comma-separated, at most [`MAX_LISTED_NAMES`] (then how many
/// more), `none` when there are none.
pub fn known_names<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> String {
    let names: Vec<S> = names.into_iter().collect();
    if names.is_empty() {
        return "none".to_string();
    }
    let refs: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    quoted_list(&refs)
}

/// `value` cut to [`MAX_QUOTED_CHARS`] characters, ending in `…` when cut:
/// what a message quotes of a value from the manifest.
pub fn clip(value: &str) -> std::borrow::Cow<'_, str> {
    match value.char_indices().nth(MAX_QUOTED_CHARS) {
        None => value.into(),
        Some((end, _)) => format!("{}…", &value[..end]).into(),
    }
}

/// `text` cut to at most [`MAX_MESSAGE_BYTES`] bytes, ending in `…` when cut.
fn bounded(text: impl Into<String>) -> String {
    let mut text = text.into();
    if text.len() > MAX_MESSAGE_BYTES {
        let end = floor_char_boundary(&text, MAX_MESSAGE_BYTES - '…'.len_utf8());
        text.truncate(end);
        text.push('…');
    }
    text
}

impl Diagnostic {
    pub fn error(summary: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            summary: bounded(summary),
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
        self.hint = Some(bounded(hint));
        self
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(bounded(detail));
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
            // Work on a window of the line around the caret, in bytes, so a
            // very long line costs no more than a short one.
            let file = &loc.file;
            let line = file.line_text(start.line);
            let line_start = file.line_start(start.line);
            let byte_in_line = |offset: usize| {
                (floor_char_boundary(file.text(), offset).saturating_sub(line_start))
                    .min(line.len())
            };
            let caret = byte_in_line(loc.span.start);
            let window_start = line[..caret]
                .char_indices()
                .rev()
                .nth(SNIPPET_MAX_CHARS / 2 - 1)
                .map_or(0, |(i, _)| i);
            let window_end = line[window_start..]
                .char_indices()
                .nth(SNIPPET_MAX_CHARS)
                .map_or(line.len(), |(i, _)| window_start + i);
            let shown: String = line[window_start..window_end]
                .chars()
                .map(|c| {
                    if c.is_control() && c != '\t' {
                        '\u{fffd}'
                    } else {
                        c
                    }
                })
                .collect();
            writeln!(f, "{} | {shown}", start.line)?;
            let before_caret = &line[window_start..caret];
            let caret_col = before_caret.chars().count();
            let marked_end = if end.line == start.line {
                byte_in_line(loc.span.end).max(caret)
            } else {
                line.len()
            };
            let width = line[caret..marked_end]
                .chars()
                .take(SNIPPET_MAX_CHARS)
                .count()
                .max(1);
            let width = width.min(SNIPPET_MAX_CHARS.saturating_sub(caret_col).max(1));
            let mut marker: String = before_caret
                .chars()
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
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
    fn key(d: &Diagnostic) -> Option<(&str, usize, usize)> {
        d.location
            .as_ref()
            .map(|l| (l.file.name(), l.span.start, l.span.end))
    }
    diagnostics.sort_by(|a, b| key(a).cmp(&key(b)));
}

/// Most diagnostics one load reports. Past this the input is not a manifest
/// with mistakes but something else (or hostile); more output helps nobody.
pub const MAX_DIAGNOSTICS: usize = 1000;

/// Whether a producer should still record diagnostics into `diags`: it may
/// go one past [`MAX_DIAGNOSTICS`], so [`finish`] knows some were dropped.
pub fn has_room(diags: &[Diagnostic]) -> bool {
    diags.len() <= MAX_DIAGNOSTICS
}

/// Sort diagnostics and cut them to [`MAX_DIAGNOSTICS`], ending with a note
/// when some were dropped.
pub fn finish(diags: &mut Vec<Diagnostic>) {
    sort(diags);
    if diags.len() > MAX_DIAGNOSTICS {
        let dropped_error = diags[MAX_DIAGNOSTICS..].iter().any(Diagnostic::is_error);
        diags.truncate(MAX_DIAGNOSTICS);
        let summary = format!("too many problems; only the first {MAX_DIAGNOSTICS} are shown");
        let note = if dropped_error {
            Diagnostic::error(summary)
        } else {
            Diagnostic::warning(summary)
        };
        diags.push(note.with_hint("fix these and run `npc validate` again"));
    }
}

/// The closest of `candidates` to `unknown`, for "did you mean" hints.
pub fn did_you_mean<'a>(
    unknown: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    /// Minimum Jaro-Winkler similarity for a suggestion.
    const SUGGESTION_THRESHOLD: f64 = 0.8;
    /// Longest name compared (the comparison costs the product of the two
    /// lengths); nothing longer is a typo of a name worth suggesting.
    const MAX_COMPARED_BYTES: usize = 128;
    if unknown.len() > MAX_COMPARED_BYTES {
        return None;
    }
    candidates
        .into_iter()
        .filter(|c| c.len() <= MAX_COMPARED_BYTES)
        .map(|c| (strsim::jaro_winkler(unknown, c), c))
        .filter(|(score, _)| *score >= SUGGESTION_THRESHOLD)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// Most names a message lists (`declared in …: `a`, `b`, …`); the rest are counted.
pub const MAX_LISTED_NAMES: usize = 20;

/// `a`, `b`, `c`: at most [`MAX_LISTED_NAMES`], each clipped, then how many more.
pub fn quoted_list(items: &[&str]) -> String {
    let mut list = items
        .iter()
        .take(MAX_LISTED_NAMES)
        .map(|v| format!("`{}`", clip(v)))
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > MAX_LISTED_NAMES {
        list.push_str(&format!(" and {} more", items.len() - MAX_LISTED_NAMES));
    }
    list
}

/// One line per distinct `what`, naming every item that has it: `singular
/// `a`: what` for one, `plural `a`, `b`, …: what` for several (the names as
/// [`quoted_list`] says them), in the order each `what` first appears.
pub fn grouped_lines<'a>(
    singular: &str,
    plural: &str,
    items: impl IntoIterator<Item = (&'a str, String)>,
) -> Vec<String> {
    let mut groups: Vec<(String, Vec<&'a str>)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (name, what) in items {
        match index.get(&what) {
            Some(&i) => groups[i].1.push(name),
            None => {
                index.insert(what.clone(), groups.len());
                groups.push((what, vec![name]));
            }
        }
    }
    groups
        .into_iter()
        .map(|(what, names)| {
            let noun = if names.len() == 1 { singular } else { plural };
            format!("{noun} {}: {what}", quoted_list(&names))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_lines_name_each_item_once_under_its_what() {
        let items = [("a", "x"), ("b", "y"), ("c", "x")].map(|(n, w)| (n, w.to_string()));
        assert_eq!(
            grouped_lines("trigger", "triggers", items),
            ["triggers `a`, `c`: x", "trigger `b`: y"]
        );
        let many: Vec<String> = (0..25).map(|i| format!("t{i}")).collect();
        let lines = grouped_lines(
            "trigger",
            "triggers",
            many.iter().map(|n| (n.as_str(), "z".to_string())),
        );
        assert_eq!(lines.len(), 1);
        assert!(lines[0].ends_with(" and 5 more: z"), "{lines:?}");
    }

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

    #[test]
    fn long_lines_are_cut_to_a_window_around_the_caret() {
        let line = format!("{}BAD{}", "é".repeat(100_000), "x".repeat(100_000));
        let file = SourceFile::new("m.json", line.as_str());
        let at = "é".len() * 100_000;
        let text = Diagnostic::error("bad").at(&file, at..at + 3).to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].ends_with("m.json:1:100001"), "{}", lines[1]);
        let quoted = lines[3].strip_prefix("1 | ").unwrap();
        assert_eq!(quoted.chars().count(), SNIPPET_MAX_CHARS);
        assert!(
            quoted.starts_with('é') && quoted.contains("BAD"),
            "{quoted}"
        );
        let marker = lines[4].strip_prefix("  | ").unwrap();
        assert_eq!(marker.find('^'), quoted.chars().position(|c| c == 'B'));
        assert_eq!(marker.trim(), "^^^");
    }

    #[test]
    fn quoted_values_and_messages_are_bounded() {
        let long = "é".repeat(10_000);
        let clipped = clip(&long);
        assert_eq!(clipped.chars().count(), MAX_QUOTED_CHARS + 1);
        assert!(clipped.ends_with('…'));
        assert_eq!(clip("short"), "short");
        let d = Diagnostic::error(format!("bad `{long}`"))
            .with_hint(long.clone())
            .with_detail(long.clone());
        for text in [
            &d.summary,
            d.hint.as_ref().unwrap(),
            d.detail.as_ref().unwrap(),
        ] {
            assert!(text.len() <= MAX_MESSAGE_BYTES, "{}", text.len());
            assert!(text.ends_with('…'));
        }
    }

    #[test]
    fn finish_caps_the_count_and_says_so() {
        let file = SourceFile::new("m.toml", "x");
        let mut diags: Vec<Diagnostic> = (0..MAX_DIAGNOSTICS + 5)
            .map(|_| Diagnostic::error("e").at(&file, 0..1))
            .collect();
        finish(&mut diags);
        assert_eq!(diags.len(), MAX_DIAGNOSTICS + 1);
        assert!(
            diags[MAX_DIAGNOSTICS]
                .summary
                .starts_with("too many problems")
        );
        assert!(diags[MAX_DIAGNOSTICS].is_error());
    }
}
