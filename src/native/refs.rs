//! Environment references in strings, in every spelling npc meets: the
//! manifest's `${VAR}` / `${VAR:-default}` / `$$`, Claude Code's `${VAR}` /
//! `${VAR:-default}`, Gemini CLI's `$VAR` / `${VAR}` and OpenCode's
//! `{env:VAR}`. Exporters translate a manifest [`Text`] into a target's
//! spelling from its source, so a secret is written as a reference and
//! never as its value; importers translate back.

use crate::model::Text;

/// One piece of a string: literal text or an environment reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Literal(String),
    Var {
        name: String,
        default: Option<String>,
    },
}

/// A target's reference syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// `${VAR}` and `${VAR:-default}`; no escape for a literal `${`.
    Claude,
    /// `$VAR` and `${VAR}`; no defaults, no escape.
    Gemini,
    /// `{env:VAR}`; no defaults, no escape.
    Opencode,
}

/// Whether `s` is an environment variable name.
pub fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

fn push_literal(out: &mut Vec<Segment>, s: &str) {
    if s.is_empty() {
        return;
    }
    if let Some(Segment::Literal(last)) = out.last_mut() {
        last.push_str(s);
    } else {
        out.push(Segment::Literal(s.to_string()));
    }
}

/// Split a manifest string (as written, before expansion) into segments.
/// Malformed references are kept as literal text; the manifest loader has
/// already rejected them for any string that reaches an exporter.
pub fn parse_manifest(source: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(i) = rest.find('$') {
        push_literal(&mut out, &rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            push_literal(&mut out, "$");
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{')
            && let Some(close) = body.find('}')
            && let Some(seg) = braced(&body[..close], true)
        {
            out.push(seg);
            rest = &body[close + 1..];
        } else {
            push_literal(&mut out, "$");
            rest = after;
        }
    }
    push_literal(&mut out, rest);
    out
}

/// `NAME` or `NAME:-default` inside `${…}`.
fn braced(body: &str, defaults: bool) -> Option<Segment> {
    let (name, default) = match body.split_once(":-") {
        Some((n, d)) if defaults => (n, Some(d.to_string())),
        Some(_) => return None,
        None => (body, None),
    };
    is_env_name(name).then(|| Segment::Var {
        name: name.to_string(),
        default,
    })
}

/// Split a string from a target file into segments, by that target's rules.
pub fn parse_target(s: &str, syntax: Syntax) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut rest = s;
    match syntax {
        Syntax::Claude | Syntax::Gemini => {
            while let Some(i) = rest.find('$') {
                push_literal(&mut out, &rest[..i]);
                let after = &rest[i + 1..];
                if let Some(body) = after.strip_prefix('{')
                    && let Some(close) = body.find('}')
                    && let Some(seg) = braced(&body[..close], syntax == Syntax::Claude)
                {
                    out.push(seg);
                    rest = &body[close + 1..];
                    continue;
                }
                if syntax == Syntax::Gemini {
                    let len = after
                        .find(|c: char| !(c == '_' || c.is_ascii_alphanumeric()))
                        .unwrap_or(after.len());
                    if len > 0 {
                        out.push(Segment::Var {
                            name: after[..len].to_string(),
                            default: None,
                        });
                        rest = &after[len..];
                        continue;
                    }
                }
                push_literal(&mut out, "$");
                rest = after;
            }
        }
        Syntax::Opencode => {
            while let Some(i) = rest.find("{env:") {
                push_literal(&mut out, &rest[..i]);
                let body = &rest[i + "{env:".len()..];
                match body.find('}') {
                    Some(close) if is_env_name(body[..close].trim()) => {
                        out.push(Segment::Var {
                            name: body[..close].trim().to_string(),
                            default: None,
                        });
                        rest = &body[close + 1..];
                    }
                    _ => {
                        push_literal(&mut out, "{env:");
                        rest = body;
                    }
                }
            }
        }
    }
    push_literal(&mut out, rest);
    out
}

/// The manifest spelling of `segments`: references as `${VAR}`, a `$` that
/// would otherwise start a reference or an escape doubled.
pub fn to_manifest(segments: &[Segment]) -> String {
    let mut out = String::new();
    for seg in segments {
        match seg {
            Segment::Literal(s) => {
                let mut chars = s.chars().peekable();
                while let Some(c) = chars.next() {
                    out.push(c);
                    if c == '$' && matches!(chars.peek(), Some('{' | '$') | None) {
                        out.push('$');
                    }
                }
            }
            Segment::Var { name, default } => push_var(&mut out, name, default.as_deref()),
        }
    }
    out
}

fn push_var(out: &mut String, name: &str, default: Option<&str>) {
    out.push_str("${");
    out.push_str(name);
    if let Some(d) = default {
        out.push_str(":-");
        out.push_str(d);
    }
    out.push('}');
}

/// A string rendered for a target, with anything the target cannot express.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    /// Human-readable problems (a dropped default, a literal the target
    /// would expand); empty when the rendering is exact.
    pub lossy: Vec<String>,
}

/// Render `text` in a target's reference syntax. Text written with `${…}`
/// is rendered from its source, so secret values never appear; literal
/// text is rendered as its value. `None` when the text is secret and has
/// no source to render from.
pub fn render(text: &Text, syntax: Syntax) -> Option<Rendered> {
    let segments = match text.source() {
        Some(source) => parse_manifest(source),
        None if text.is_secret() => return None,
        None => vec![Segment::Literal(text.expose().to_string())],
    };
    let mut out = String::new();
    let mut lossy = Vec::new();
    for seg in &segments {
        match seg {
            Segment::Literal(s) => {
                let expands = match syntax {
                    Syntax::Claude => s.contains("${"),
                    Syntax::Gemini => parse_target(s, Syntax::Gemini)
                        .iter()
                        .any(|seg| matches!(seg, Segment::Var { .. })),
                    Syntax::Opencode => s.contains("{env:"),
                };
                if expands {
                    lossy.push(format!(
                        "literal text `{s}` would be expanded as a reference"
                    ));
                }
                out.push_str(s);
            }
            Segment::Var { name, default } => match syntax {
                Syntax::Claude => push_var(&mut out, name, default.as_deref()),
                Syntax::Gemini | Syntax::Opencode => {
                    if let Some(d) = default {
                        lossy.push(format!(
                            "default `{d}` of `${{{name}:-…}}` is not supported there and was dropped"
                        ));
                    }
                    if syntax == Syntax::Gemini {
                        push_var(&mut out, name, None);
                    } else {
                        out.push_str("{env:");
                        out.push_str(name);
                        out.push('}');
                    }
                }
            },
        }
    }
    Some(Rendered { text: out, lossy })
}

/// When `text` is exactly one reference `${VAR}` (no default, nothing
/// around it), the variable's name.
pub fn sole_var(text: &Text) -> Option<String> {
    match parse_manifest(text.source()?).as_slice() {
        [
            Segment::Var {
                name,
                default: None,
            },
        ] => Some(name.clone()),
        _ => None,
    }
}

/// When `text` is exactly `Bearer ${VAR}`, the variable's name.
pub fn bearer_var(text: &Text) -> Option<String> {
    match parse_manifest(text.source()?).as_slice() {
        [
            Segment::Literal(prefix),
            Segment::Var {
                name,
                default: None,
            },
        ] if prefix == "Bearer " => Some(name.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn var(name: &str) -> Segment {
        Segment::Var {
            name: name.into(),
            default: None,
        }
    }

    #[test]
    fn manifest_spelling_parses_references_escapes_and_dollars() {
        assert_eq!(
            parse_manifest("a ${X} $${Y} $5 ${Z:-d}"),
            vec![
                Segment::Literal("a ".into()),
                var("X"),
                Segment::Literal(" ${Y} $5 ".into()),
                Segment::Var {
                    name: "Z".into(),
                    default: Some("d".into())
                },
            ]
        );
    }

    #[test]
    fn target_spellings_parse() {
        assert_eq!(
            parse_target("Bearer {env:TOK}", Syntax::Opencode),
            vec![Segment::Literal("Bearer ".into()), var("TOK")]
        );
        assert_eq!(
            parse_target("$HOME/x ${Y}", Syntax::Gemini),
            vec![var("HOME"), Segment::Literal("/x ".into()), var("Y")]
        );
        assert_eq!(
            parse_target("$HOME/x ${Y:-z}", Syntax::Claude),
            vec![
                Segment::Literal("$HOME/x ".into()),
                Segment::Var {
                    name: "Y".into(),
                    default: Some("z".into())
                }
            ]
        );
        assert_eq!(
            parse_target("{env:not a name}", Syntax::Opencode),
            vec![Segment::Literal("{env:not a name}".into())]
        );
    }

    #[test]
    fn secrets_render_as_references_never_values() {
        let t = Text::interpolated("Bearer ${TOK}", "Bearer hunter2", true);
        for syntax in [Syntax::Claude, Syntax::Gemini, Syntax::Opencode] {
            let r = render(&t, syntax).unwrap();
            assert!(!r.text.contains("hunter2"), "{r:?}");
        }
        assert_eq!(
            render(&t, Syntax::Opencode).unwrap().text,
            "Bearer {env:TOK}"
        );
        assert_eq!(render(&Text::secret("hunter2"), Syntax::Claude), None);
        assert_eq!(bearer_var(&t).as_deref(), Some("TOK"));
        assert_eq!(sole_var(&t), None);
    }

    #[test]
    fn dropped_defaults_and_expandable_literals_are_reported() {
        let t = Text::interpolated("${A:-x}", "x", false);
        let r = render(&t, Syntax::Gemini).unwrap();
        assert_eq!(r.text, "${A}");
        assert_eq!(r.lossy.len(), 1);
        let lit = Text::interpolated("$${A}", "${A}", false);
        assert_eq!(render(&lit, Syntax::Claude).unwrap().lossy.len(), 1);
        assert!(render(&lit, Syntax::Opencode).unwrap().lossy.is_empty());
    }

    proptest! {
        #[test]
        fn manifest_spelling_round_trips(s in "[a-zA-Z0-9 ${}:_-]{0,40}") {
            let segs = parse_manifest(&s);
            let spelled = to_manifest(&segs);
            prop_assert_eq!(parse_manifest(&spelled), segs);
        }

        #[test]
        fn target_parsers_never_panic(s in "\\PC{0,60}") {
            for syntax in [Syntax::Claude, Syntax::Gemini, Syntax::Opencode] {
                let _ = to_manifest(&parse_target(&s, syntax));
            }
        }
    }
}
