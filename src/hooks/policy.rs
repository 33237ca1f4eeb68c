//! A profile's tool policy: the calls its `ask_tools` patterns match need
//! the user's approval. The [`HookRunner`](super::HookRunner) applies it
//! after the `before_tool` hooks (on the arguments they left, and only when
//! no hook asked about the call already): a match is asked like a hook's
//! `ask` — through the runner's approver (the editor under `npc acp`), and
//! denied when there is none. Which profile an agent runs for reaches its
//! hooks in [`PROFILE_ENV`], which every run of a profile sets
//! (`runs::prepare`).
//!
//! Patterns (the syntax of `allowed_tools`): `NAME` matches the tool's name,
//! `*` standing for any characters (`Bash`, `mcp__fs__*`, `*`);
//! `NAME(SUBJECT)` also needs the call's subject — its `command` argument
//! (an array of words joined by spaces), else `file_path`, `path` or `url` —
//! to match `SUBJECT`: `PREFIX:*` is a prefix (`Bash(git push:*)`), anything
//! else a whole-subject pattern with `*` (`Edit(*.lock)`). Patterns compile to
//! anchored regular expressions (linear-time matching), within
//! [`MAX_PATTERN_CHARS`].

use serde_json::Value;

use super::ToolCallInfo;
use crate::model::Manifest;

/// Environment variable naming the profile an agent runs for.
pub const PROFILE_ENV: &str = "NPC_PROFILE";
/// Longest `ask_tools` pattern.
pub const MAX_PATTERN_CHARS: usize = 1024;
/// Compiled size limit of one pattern's regular expression.
pub const MAX_PATTERN_REGEX_BYTES: usize = 1024 * 1024;
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
    #[error("it does not compile: {0}")]
    Compile(String),
}

/// One compiled `ask_tools` pattern.
#[derive(Debug, Clone)]
pub struct ToolPattern {
    text: String,
    name: regex::Regex,
    subject: Option<regex::Regex>,
}

/// `glob` (only `*` is special) as an anchored regular expression;
/// `prefix` leaves the end open.
fn compile(glob: &str, prefix: bool) -> Result<regex::Regex, PatternError> {
    let body: Vec<String> = glob.split('*').map(regex::escape).collect();
    let tail = if prefix { "" } else { "$" };
    regex::RegexBuilder::new(&format!("^(?s:{}){tail}", body.join(".*")))
        .size_limit(MAX_PATTERN_REGEX_BYTES)
        .build()
        .map_err(|e| PatternError::Compile(e.to_string()))
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
        let subject = match subject {
            None => None,
            Some(spec) => Some(match spec.strip_suffix(":*") {
                Some(prefix) => compile(prefix, true)?,
                None => compile(spec, false)?,
            }),
        };
        Ok(Self {
            text: trimmed.to_string(),
            name: compile(name, false)?,
            subject,
        })
    }

    /// The pattern as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn matches(&self, call: &ToolCallInfo) -> bool {
        if !self.name.is_match(&call.name) {
            return false;
        }
        match &self.subject {
            None => true,
            Some(re) => subject(&call.arguments).is_some_and(|s| re.is_match(&s)),
        }
    }
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

/// The tool policy of one profile.
#[derive(Debug, Clone)]
pub struct ToolPolicy {
    profile: String,
    ask: Vec<ToolPattern>,
}

impl ToolPolicy {
    /// The policy of profile `name`; `None` when it has no `ask_tools` (or
    /// no such profile). A pattern that does not parse (the manifest's
    /// validation refuses it) asks about every call: fail closed.
    pub fn for_profile(manifest: &Manifest, name: &str) -> Option<Self> {
        let profile = manifest.profiles.get(name)?;
        if profile.ask_tools.is_empty() {
            return None;
        }
        let ask = profile
            .ask_tools
            .iter()
            .map(|p| ToolPattern::parse(p).or_else(|_| ToolPattern::parse("*")))
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        Some(Self {
            profile: name.to_string(),
            ask,
        })
    }

    /// The policy of the profile [`PROFILE_ENV`] names, if any.
    pub fn from_env(manifest: &Manifest) -> Option<Self> {
        let name = std::env::var(PROFILE_ENV).ok()?;
        Self::for_profile(manifest, &name)
    }

    pub fn profile(&self) -> &str {
        &self.profile
    }

    /// The first pattern that asks about `call`.
    pub fn asks(&self, call: &ToolCallInfo) -> Option<&ToolPattern> {
        self.ask.iter().find(|p| p.matches(call))
    }

    /// Whether the policy may ask about a call of tool `name` (whatever its
    /// arguments): lets a caller skip the hooks' machinery when it cannot.
    pub fn may_ask(&self, name: &str) -> bool {
        self.ask.iter().any(|p| p.name.is_match(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, arguments: Value) -> ToolCallInfo {
        ToolCallInfo {
            id: "c".into(),
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn names_subjects_prefixes_and_wildcards_match_as_documented() {
        let p = |t: &str| ToolPattern::parse(t).unwrap();
        let bash = |c: &str| call("Bash", json!({ "command": c }));
        assert!(p("Bash").matches(&bash("ls")));
        assert!(!p("Bash").matches(&call("BashOutput", json!({}))));
        assert!(p("mcp__fs__*").matches(&call("mcp__fs__write_file", json!({}))));
        assert!(!p("mcp__fs__*").matches(&call("mcp__web__get", json!({}))));
        assert!(p("*").matches(&call("anything", json!(null))));
        assert!(p("Bash(git push:*)").matches(&bash("git push origin main")));
        assert!(!p("Bash(git push:*)").matches(&bash("git status")));
        assert!(!p("Bash(git push:*)").matches(&call("Bash", json!({}))));
        assert!(p("Edit(*.lock)").matches(&call("Edit", json!({"file_path": "Cargo.lock"}))));
        assert!(!p("Edit(*.lock)").matches(&call("Edit", json!({"file_path": "a.lock.rs"}))));
        // Codex's shell passes argv; regex syntax in a pattern is literal.
        assert!(
            p("shell(rm -rf:*)").matches(&call("shell", json!({"command": ["rm", "-rf", "/"]})))
        );
        assert!(!p("a.c").matches(&call("abc", json!({}))));
        assert!(p("Bash(a\nb)").matches(&bash("a\nb")));
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
}
