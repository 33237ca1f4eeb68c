//! Hints name commands that exist: every `npc …` command line the sources
//! put in front of a person (an error message, a hint, help text, a doc
//! comment) names a real subcommand of the real binary, and a real
//! sub-subcommand where that subcommand has them.
//!
//! What is scanned: the string literals (plain, raw and byte strings) and
//! the doc comments (`///`, `//!`: clap's help and the API docs are made of
//! them) of every `src/**/*.rs`, and the whole text of every `src/**/*.toml`
//! (the starter manifest, whose comments users read). Plain comments and
//! code are not: they are written for whoever edits the source.
//!
//! What counts as naming a command line: `npc` right after a backtick
//! (`` `npc plan --format json` ``), or after the word "run", "try" or
//! "use" (any case: "Run npc validate"), followed by words of lowercase
//! letters, digits, `-` and `_`, one space apart. That leaves out prose
//! about npc ("npc has no runtime for this kind", "npc leaves it
//! untouched", "npc ships one"), which is neither quoted nor an
//! instruction. The first word must be a subcommand; when it has
//! subcommands, the second word (if there is one) must be one of them; the
//! words after that are arguments and are not checked (a group named alone,
//! `` `npc pane` ``, is fine).
//!
//! The commands come from the binary itself: the `Commands:` sections of
//! `npc --help` and `npc help COMMAND`, and `npc WORD --help` succeeding
//! for a hidden one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support::{npc_path, repo_root};

/// What a piece of scanned text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Literal,
    Doc,
}

/// The string literals and doc comments of Rust source `text`, each with
/// the line it starts on.
fn user_text(text: &str) -> Vec<(Kind, usize, String)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < bytes.len() {
        let rest = &text[i..];
        let c = bytes[i];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(bytes.len(), |n| i + n);
            let comment = &text[i..end];
            let doc = (comment.starts_with("///") && !comment.starts_with("////"))
                || comment.starts_with("//!");
            if doc {
                found.push((Kind::Doc, line, comment[3..].to_string()));
            }
            i = end;
        } else if rest.starts_with("/*") {
            let mut depth = 0;
            while i < bytes.len() {
                if text[i..].starts_with("/*") {
                    depth += 1;
                    i += 2;
                } else if text[i..].starts_with("*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(bytes[i] == b'\n');
                    i += 1;
                }
            }
        } else if (c == b'r' || c == b'b') && (i == 0 || !ident(bytes[i - 1])) {
            // `r"…"`, `r#"…"#`, `br"…"`, `b"…"` or an identifier.
            let mut j = i + 1;
            if c == b'b' && bytes.get(j) == Some(&b'r') {
                j += 1;
            }
            let raw = j > i + 1 || c == b'r';
            let hashes = bytes[j..].iter().take_while(|&&b| b == b'#').count();
            if bytes.get(j + hashes) == Some(&b'"') && (raw || hashes == 0) {
                if raw {
                    let close = format!("\"{}", "#".repeat(hashes));
                    let start = j + hashes + 1;
                    let end = text[start..]
                        .find(&close)
                        .map_or(bytes.len(), |n| start + n);
                    found.push((Kind::Literal, line, text[start..end].to_string()));
                    line += text[i..end].matches('\n').count();
                    i = (end + close.len()).min(bytes.len());
                } else {
                    i = j; // a byte string: read as a plain one below
                }
            } else {
                while i < bytes.len() && ident(bytes[i]) {
                    i += 1;
                }
            }
        } else if c == b'"' {
            let start = i + 1;
            let mut j = start;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            let body = &text[start..j.min(bytes.len())];
            found.push((Kind::Literal, line, unescape(body)));
            line += body.matches('\n').count();
            i = j + 1;
        } else if c == b'\'' {
            // A char literal (`'"'`, `'\''`, `'\u{1b}'`) or a lifetime.
            if bytes.get(i + 1) == Some(&b'\\') {
                let end = text[i + 3..].find('\'').map_or(bytes.len(), |n| i + 3 + n);
                i = end + 1;
            } else if let Some(ch) = text[i + 1..].chars().next()
                && text[i + 1 + ch.len_utf8()..].starts_with('\'')
            {
                i += 2 + ch.len_utf8();
            } else {
                i += 1;
            }
        } else {
            line += usize::from(c == b'\n');
            i += 1;
        }
    }
    found
}

/// A plain literal's text as the program sees it, as far as words go: a
/// line continuation (`\` at the end of a line) joins the lines, and the
/// escapes `\n` and `\t` become what they stand for.
fn unescape(body: &str) -> String {
    let pattern = regex::Regex::new(r"\\\n\s*").expect("the pattern is valid");
    pattern
        .replace_all(body, "")
        .replace("\\n", "\n")
        .replace("\\t", "\t")
}

/// The command lines `text` names (see the module docs), as their words.
fn named_commands(text: &str) -> Vec<Vec<String>> {
    let pattern = regex::Regex::new(
        r"(?:`npc|\b(?:[Rr]un|[Tt]ry|[Uu]se|RUN|TRY|USE) npc)((?: [a-z_][a-z0-9_-]*)+)",
    )
    .expect("the pattern is valid");
    pattern
        .captures_iter(text)
        .map(|c| c[1].split_whitespace().map(str::to_string).collect())
        .collect()
}

/// The names in the `Commands:` section of a clap help text.
fn help_commands(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

fn help_of(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(npc_path())
        .args(args)
        .output()
        .expect("npc runs");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The binary's command tree: each subcommand and its own subcommands,
/// learned lazily so a hidden subcommand a hint names is asked for too.
struct Commands {
    known: BTreeMap<String, Option<BTreeSet<String>>>,
}

impl Commands {
    fn from_binary() -> Self {
        let top = help_of(&["--help"]).expect("`npc --help` succeeds");
        let known = help_commands(&top)
            .into_iter()
            .map(|name| {
                let help = help_of(&["help", &name]).expect("`npc help NAME` succeeds");
                (name, Some(help_commands(&help)))
            })
            .collect();
        Self { known }
    }

    /// Whether `words` (a command line's words after `npc`) names commands
    /// that exist, as far as the rule in the module docs goes.
    fn exist(&mut self, words: &[String]) -> bool {
        let first = &words[0];
        let subs = self
            .known
            .entry(first.clone())
            .or_insert_with(|| help_of(&[first, "--help"]).map(|help| help_commands(&help)))
            .clone();
        match (subs, words.get(1)) {
            (None, _) => false,
            (Some(subs), Some(second)) if !subs.is_empty() => subs.contains(second),
            (Some(_), _) => true,
        }
    }
}

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs" || e == "toml") {
            out.push(path);
        }
    }
}

/// Every command line named in `src/` that does not exist, as
/// `file:line: `npc …``, and how many were checked.
fn offenders(commands: &mut Commands) -> (Vec<String>, usize) {
    let mut files = Vec::new();
    source_files(&repo_root().join("src"), &mut files);
    files.sort();
    let mut checked = 0;
    let mut missing = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("sources are UTF-8");
        let pieces = if file.extension().is_some_and(|e| e == "toml") {
            vec![(Kind::Doc, 1, text)]
        } else {
            user_text(&text)
        };
        for (_, line, piece) in pieces {
            for words in named_commands(&piece) {
                checked += 1;
                if !commands.exist(&words) {
                    let shown = file.strip_prefix(repo_root()).unwrap_or(file);
                    missing.push(format!(
                        "{}:{line}: `npc {}`",
                        shown.display(),
                        words.join(" ")
                    ));
                }
            }
        }
    }
    (missing, checked)
}

#[test]
fn every_npc_command_a_hint_names_exists() {
    let mut commands = Commands::from_binary();
    assert!(
        commands.known.len() > 15 && commands.known["pane"].as_ref().unwrap().contains("attach"),
        "the command tree read from the binary looks wrong: {:?}",
        commands.known
    );
    let (missing, checked) = offenders(&mut commands);
    assert!(checked > 100, "the scan found only {checked} command lines");
    assert!(
        missing.is_empty(),
        "hints name commands that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_scan_reads_literals_and_docs_and_leaves_prose_and_code_alone() {
    let source = r##"
//! Start it with `npc daemon`; npc leaves it untouched.
/// Run npc validate first, then `npc plugin frobnicate PATH`.
fn f() -> String {
    // `npc nothing` in a plain comment is for whoever edits this.
    let c = '"'; let l: &'static str = "try npc runs show ID";
    let raw = r#"see `npc hook setup` "quoted""#;
    format!("{c}{l}{raw} npc has no runtime for this kind; `npc {name} x`")
}
"##;
    let pieces = user_text(source);
    let found: Vec<(Kind, usize, Vec<Vec<String>>)> = pieces
        .iter()
        .map(|(kind, line, text)| (*kind, *line, named_commands(text)))
        .filter(|(_, _, c)| !c.is_empty())
        .collect();
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        found,
        [
            (Kind::Doc, 2, vec![words(&["daemon"])]),
            (
                Kind::Doc,
                3,
                vec![
                    words(&["validate", "first"]),
                    words(&["plugin", "frobnicate"])
                ]
            ),
            (Kind::Literal, 6, vec![words(&["runs", "show"])]),
            (Kind::Literal, 7, vec![words(&["hook", "setup"])]),
        ]
    );
    let mut commands = Commands::from_binary();
    assert!(commands.exist(&words(&["daemon"])));
    assert!(commands.exist(&words(&["runs", "show", "id"])));
    assert!(commands.exist(&words(&["run", "review"])));
    assert!(commands.exist(&words(&["pane"])));
    assert!(commands.exist(&words(&["__watchdog"])));
    assert!(!commands.exist(&words(&["hook", "setup"])));
    assert!(!commands.exist(&words(&["plugin", "frobnicate"])));
    assert!(!commands.exist(&words(&["frobnicate"])));
}
