//! Environment interpolation in manifest strings: `${VAR}`, `${VAR:-default}`
//! and `$$` for a literal `$`. A value that took anything from the
//! environment is marked secret, so it prints redacted everywhere.

use std::ops::Range;

/// Where variable values come from. The loader passes the process
/// environment; tests pass a map.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;

    /// Whether a `${NAME}` this environment does not set is only a warning
    /// (`npc validate --allow-missing-env`: CI checks a manifest without its
    /// secrets); the value is then a placeholder no later check reads.
    fn unset_is_warning(&self) -> bool {
        false
    }
}

impl Env for std::collections::BTreeMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// The result of interpolating one string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpolated {
    pub value: String,
    /// True when any part of `value` came from the environment.
    pub secret: bool,
}

/// One problem in one string; `range` is a byte range within that string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterpError {
    Unset { name: String, range: Range<usize> },
    Malformed { range: Range<usize> },
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// `${PLUGIN_ROOT}` and `${PLUGIN_DATA}` are placeholders of a plugin's
/// hooks and servers, never environment variables: interpolation keeps them
/// as written (see `crate::plugins::expand`).
pub const PLUGIN_PLACEHOLDERS: [&str; 2] = ["PLUGIN_ROOT", "PLUGIN_DATA"];

/// Expand every `${…}` in `input`. All problems are returned, not just the first.
pub fn interpolate(input: &str, env: &dyn Env) -> Result<Interpolated, Vec<InterpError>> {
    if !input.contains('$') {
        return Ok(Interpolated {
            value: input.to_string(),
            secret: false,
        });
    }
    let mut out = String::with_capacity(input.len());
    let mut secret = false;
    let mut errors = Vec::new();
    let mut rest = input;
    let mut offset = 0;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            offset += i + 2;
            rest = tail;
        } else if let Some(body_and_tail) = after.strip_prefix('{') {
            let Some(close) = body_and_tail.find('}') else {
                errors.push(InterpError::Malformed {
                    range: offset + i..input.len(),
                });
                rest = "";
                break;
            };
            let body = &body_and_tail[..close];
            let range = offset + i..offset + i + close + 3;
            let (name, default) = match body.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (body, None),
            };
            if !is_name(name) {
                errors.push(InterpError::Malformed {
                    range: range.clone(),
                });
            } else if default.is_none() && PLUGIN_PLACEHOLDERS.contains(&name) {
                // Not an environment variable: kept for the plugin that owns the entry.
                out.push_str(&input[range.clone()]);
            } else if let Some(value) = env.var(name) {
                out.push_str(&value);
                secret = true;
            } else if let Some(default) = default {
                out.push_str(default);
            } else {
                errors.push(InterpError::Unset {
                    name: name.to_string(),
                    range: range.clone(),
                });
            }
            offset = range.end;
            rest = &body_and_tail[close + 1..];
        } else {
            out.push('$');
            offset += i + 1;
            rest = after;
        }
    }
    out.push_str(rest);
    if errors.is_empty() {
        Ok(Interpolated { value: out, secret })
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn env() -> BTreeMap<String, String> {
        [("TOKEN".to_string(), "s3cret".to_string())].into()
    }

    #[test]
    fn plugin_placeholders_are_kept_and_never_read_from_the_environment() {
        let env: BTreeMap<String, String> =
            [("PLUGIN_ROOT".to_string(), "/env".to_string())].into();
        let r = interpolate("${PLUGIN_ROOT}/a:${PLUGIN_DATA}", &env).unwrap();
        assert_eq!(r.value, "${PLUGIN_ROOT}/a:${PLUGIN_DATA}");
        assert!(!r.secret);
        assert_eq!(interpolate("${PLUGIN_DATA:-x}", &env).unwrap().value, "x");
    }

    #[test]
    fn expands_and_marks_secret() {
        let r = interpolate("Bearer ${TOKEN}", &env()).unwrap();
        assert_eq!(
            r,
            Interpolated {
                value: "Bearer s3cret".into(),
                secret: true
            }
        );
    }

    #[test]
    fn defaults_are_not_secret() {
        let r = interpolate("${MISSING:-fallback}/x", &env()).unwrap();
        assert_eq!(
            r,
            Interpolated {
                value: "fallback/x".into(),
                secret: false
            }
        );
    }

    #[test]
    fn dollar_escapes_and_plain_dollars() {
        let r = interpolate("$${TOKEN} costs $5", &env()).unwrap();
        assert_eq!(r.value, "${TOKEN} costs $5");
        assert!(!r.secret);
    }

    #[test]
    fn reports_every_problem_with_ranges() {
        let errs = interpolate("${A} ${9x} ${B", &env()).unwrap_err();
        assert_eq!(
            errs,
            vec![
                InterpError::Unset {
                    name: "A".into(),
                    range: 0..4
                },
                InterpError::Malformed { range: 5..10 },
                InterpError::Malformed { range: 11..14 },
            ]
        );
    }
}
