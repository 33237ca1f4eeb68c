//! Tool patterns (the syntax of a profile's `allowed_tools` and
//! `ask_tools`): `NAME` matches the tool's name, `*` standing for any
//! characters (`Bash`, `mcp__fs__*`, `*`); `NAME(SUBJECT)` also needs the
//! call's subject — its `command` argument (an array of words joined by
//! spaces), else `file_path`, `path` or `url` — to match `SUBJECT`:
//! `PREFIX:*` is a prefix (`Bash(git push:*)`), anything else a
//! whole-subject pattern with `*` (`Edit(*.lock)`). A pattern is kept as
//! its literal parts between `*`s and matched by finding them in order
//! (leftmost first, which is exact when `*` is the only wildcard), in time
//! linear in the text, within [`MAX_PATTERN_CHARS`]; no regular expression
//! is compiled, so loading a manifest stays cheap. The manifest's validation parses them; the hook
//! runner's tool policy (`hooks::policy`) matches calls with them.

use serde_json::Value;

/// Longest `ask_tools` pattern.
pub const MAX_PATTERN_CHARS: usize = 1024;
/// The arguments that are a call's subject, in order of preference.
pub const SUBJECT_ARGUMENTS: [&str; 4] = ["command", "file_path", "path", "url"];

/// Why an `ask_tools` pattern is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("it is empty")]
    Empty,
    #[error("it is longer than {MAX_PATTERN_CHARS} characters")]
    TooLong,
    #[error("`(` opens a subject that does not end the pattern with `)`")]
    Unclosed,
    #[error("it names no tool before `(`")]
    NoName,
}

/// One parsed `ask_tools` pattern.
#[derive(Debug, Clone)]
pub struct ToolPattern {
    text: String,
    name: Glob,
    subject: Option<Glob>,
}

/// A pattern where only `*` is special: the literal parts around each `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Glob {
    /// At least one part; `*` stood between consecutive parts.
    parts: Vec<String>,
}

impl Glob {
    /// `glob`; `prefix` leaves the end open (as if it ended with `*`).
    fn new(glob: &str, prefix: bool) -> Self {
        let mut parts: Vec<String> = glob.split('*').map(str::to_string).collect();
        if prefix {
            parts.push(String::new());
        }
        Self { parts }
    }

    /// Whether the whole of `text` matches: the first part starts it, the
    /// last ends it, and the ones between occur in order, each found at its
    /// leftmost place after the one before.
    fn is_match(&self, text: &str) -> bool {
        let (first, rest) = self.parts.split_first().expect("a glob has a part");
        let Some((last, middle)) = rest.split_last() else {
            return text == first;
        };
        if text.len() < first.len() + last.len()
            || !text.starts_with(first.as_str())
            || !text.ends_with(last.as_str())
        {
            return false;
        }
        let mut between = &text[first.len()..text.len() - last.len()];
        for part in middle {
            match between.find(part.as_str()) {
                Some(at) => between = &between[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

impl ToolPattern {
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(PatternError::Empty);
        }
        if trimmed.chars().count() > MAX_PATTERN_CHARS {
            return Err(PatternError::TooLong);
        }
        let (name, subject) = match trimmed.split_once('(') {
            None => (trimmed, None),
            Some((name, rest)) => {
                let spec = rest.strip_suffix(')').ok_or(PatternError::Unclosed)?;
                (name.trim(), Some(spec))
            }
        };
        if name.is_empty() {
            return Err(PatternError::NoName);
        }
        let subject = subject.map(|spec| match spec.strip_suffix(":*") {
            Some(prefix) => Glob::new(prefix, true),
            None => Glob::new(spec, false),
        });
        Ok(Self {
            text: trimmed.to_string(),
            name: Glob::new(name, false),
            subject,
        })
    }

    /// Whether the pattern also needs the call's subject (`NAME(SUBJECT)`).
    pub fn has_subject(&self) -> bool {
        self.subject.is_some()
    }

    /// The pattern as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether a call of tool `name` with `arguments` matches.
    pub fn matches(&self, name: &str, arguments: &Value) -> bool {
        if !self.matches_name(name) {
            return false;
        }
        match &self.subject {
            None => true,
            Some(re) => subject(arguments).is_some_and(|s| re.is_match(&s)),
        }
    }

    /// Whether the tool's name matches (whatever the call's arguments),
    /// however the agent spells it ([`dashed`]).
    pub fn matches_name(&self, name: &str) -> bool {
        self.name.is_match(name) || (name.contains('_') && self.name.is_match(&dashed(name)))
    }
}

/// `tool` with `_` as `-` inside each `__`-separated part, the separators
/// kept: `mcp__my_server__get_env` → `mcp__my-server__get-env`. Codex
/// spells MCP tool and server names so (`get-env` arrives as `get_env`);
/// a pattern or matcher written with the manifest's spelling is tried
/// against this form too.
pub fn dashed(tool: &str) -> String {
    tool.split("__")
        .map(|part| part.replace('_', "-"))
        .collect::<Vec<_>>()
        .join("__")
}

/// A call's subject (see the module documentation).
fn subject(arguments: &Value) -> Option<String> {
    SUBJECT_ARGUMENTS
        .iter()
        .find_map(|key| match arguments.get(key)? {
            Value::String(s) => Some(s.clone()),
            Value::Array(words) => words
                .iter()
                .map(|w| w.as_str())
                .collect::<Option<Vec<_>>>()
                .map(|w| w.join(" ")),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, arguments: Value) -> (String, Value) {
        (name.to_string(), arguments)
    }

    trait Hits {
        fn hits(&self, call: &(String, Value)) -> bool;
    }

    impl Hits for ToolPattern {
        fn hits(&self, (name, arguments): &(String, Value)) -> bool {
            self.matches(name, arguments)
        }
    }

    #[test]
    fn names_subjects_prefixes_and_wildcards_match_as_documented() {
        let p = |t: &str| ToolPattern::parse(t).unwrap();
        let bash = |c: &str| call("Bash", json!({ "command": c }));
        assert!(p("Bash").hits(&bash("ls")));
        assert!(!p("Bash").hits(&call("BashOutput", json!({}))));
        assert!(p("mcp__fs__*").hits(&call("mcp__fs__write_file", json!({}))));
        assert!(!p("mcp__fs__*").hits(&call("mcp__web__get", json!({}))));
        assert!(p("*").hits(&call("anything", json!(null))));
        assert!(p("Bash(git push:*)").hits(&bash("git push origin main")));
        assert!(!p("Bash(git push:*)").hits(&bash("git status")));
        assert!(!p("Bash(git push:*)").hits(&call("Bash", json!({}))));
        assert!(p("Edit(*.lock)").hits(&call("Edit", json!({"file_path": "Cargo.lock"}))));
        assert!(!p("Edit(*.lock)").hits(&call("Edit", json!({"file_path": "a.lock.rs"}))));
        // Codex's shell passes argv; regex syntax in a pattern is literal.
        assert!(p("shell(rm -rf:*)").hits(&call("shell", json!({"command": ["rm", "-rf", "/"]}))));
        assert!(!p("a.c").hits(&call("abc", json!({}))));
        assert!(p("Bash(a\nb)").hits(&bash("a\nb")));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        assert_eq!(ToolPattern::parse(" ").unwrap_err(), PatternError::Empty);
        assert_eq!(
            ToolPattern::parse("Bash(ls").unwrap_err(),
            PatternError::Unclosed
        );
        assert_eq!(
            ToolPattern::parse("(ls)").unwrap_err(),
            PatternError::NoName
        );
        assert_eq!(
            ToolPattern::parse(&"a".repeat(MAX_PATTERN_CHARS + 1)).unwrap_err(),
            PatternError::TooLong
        );
    }

    /// The matcher agrees with the anchored regular expression a pattern
    /// stands for (`*` as `.*`, everything else literal), on texts drawn
    /// from the pattern's own alphabet so that matches are frequent.
    mod against_regex {
        use super::super::Glob;
        use proptest::prelude::*;

        fn oracle(glob: &str, prefix: bool, text: &str) -> bool {
            let body: Vec<String> = glob.split('*').map(regex::escape).collect();
            let tail = if prefix { "" } else { "$" };
            regex::Regex::new(&format!("^(?s:{}){tail}", body.join(".*")))
                .unwrap()
                .is_match(text)
        }

        proptest! {
            #[test]
            fn globs_match_as_their_regex(
                glob in "[ab*.\n]{0,8}",
                text in "[ab.\n]{0,12}",
                prefix: bool,
            ) {
                prop_assert_eq!(
                    Glob::new(&glob, prefix).is_match(&text),
                    oracle(&glob, prefix, &text),
                    "glob {:?} prefix {} text {:?}", glob, prefix, text
                );
            }
        }
    }
}
