//! The documentation is tested: every manifest example in `README.md` and
//! `docs/` (a fenced block whose info string is `toml npcagent`) is valid
//! to the real `npc validate`, in a scratch git repository; every other
//! TOML block says it is no manifest (`toml not-a-manifest`), so none
//! escapes the check by its fence; every relative link in `README.md` and
//! `docs/` names a file that exists, and its `#anchor` a heading of that
//! page; the README stays short and gives the test command CI runs; and no
//! internal code name reaches a page a user reads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{npc, repo_root};
use crate::worktrees::git;

/// The info string that marks a complete manifest to validate.
const MANIFEST_FENCE: &str = "toml npcagent";
/// The info string that marks a manifest shown for its errors: `npc
/// validate` must reject it, and print what the blocks after it show.
const INVALID_FENCE: &str = "toml npcagent-invalid";
/// The info strings of the blocks that show what `npc validate` prints for
/// the deliberate error before them, as text and as JSON.
const VALIDATE_TEXT_FENCE: &str = "text npc-validate";
const VALIDATE_JSON_FENCE: &str = "json npc-validate";
/// The info string of a TOML block that is no manifest (another tool's file).
const OTHER_TOML_FENCE: &str = "toml not-a-manifest";
/// Fewest manifest examples the guide holds: fewer means the extraction
/// lost them (a changed fence), not that the guide has none.
const MIN_MANIFEST_BLOCKS: usize = 10;
/// Fewest relative links the pages hold, for the same reason.
const MIN_RELATIVE_LINKS: usize = 40;
/// The issue's bound on the README: a front page, not the manual.
const README_MAX_BYTES: usize = 12 * 1024;
/// Fewest `npc …` command lines the pages hold (the README's tour alone
/// has eight).
const MIN_COMMAND_LINES: usize = 40;
/// Characters of the synopsis notation (`[--all]`, `a|b`, `…`, `<x>`) or of
/// the shell (quotes, `$VAR`): a span holding one is a pattern, not a
/// command line to parse.
const NOTATION: &[char] = &[
    '[', ']', '|', '…', '<', '>', '{', '}', '\'', '"', '$', '(', ')',
];
/// A sample value for each placeholder the pages write in capitals where
/// the command line takes a value it checks (an enum, a number, an address).
const PLACEHOLDERS: &[(&str, &str)] = &[
    ("EVENT", "before_tool"),
    ("CLI", "claude"),
    ("SHELL", "bash"),
    ("COMMAND", "status"),
    ("SECS", "30"),
    ("N", "10"),
    ("ADDR", "127.0.0.1:8080"),
];
/// Fewest pages under `man/man1` (one per command; fewer means the pages
/// were not found, not that the commands went).
const MIN_MAN_PAGES: usize = 40;
/// Internal names (the project's seed documents, other products' code
/// names) that never reach a page a user reads.
const INTERNAL_NAMES: &[&str] = &["seed 0", "Orcacode", "NPCAgent seed"];

/// A fenced code block of a Markdown page.
#[derive(Debug)]
struct Block {
    /// The page, relative to the repository.
    page: String,
    /// Line of the opening fence (1-based).
    line: usize,
    /// The info string after the fence (`toml npcagent`).
    info: String,
    /// The block's text, without the fence's indentation.
    text: String,
}

/// `README.md`, every Markdown page under `docs/`, and the README of the
/// fleet example (which points into the guide).
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, into: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, into);
            } else if path.extension().is_some_and(|e| e == "md") {
                into.push(path);
            }
        }
    }
    let mut pages = vec![
        repo_root().join("README.md"),
        repo_root().join("examples/fleet/README.md"),
    ];
    walk(&repo_root().join("docs"), &mut pages);
    pages.sort();
    pages
}

fn shown(path: &Path) -> String {
    path.strip_prefix(repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The fence a line opens or closes, if any: its indentation and info string.
fn fence(line: &str) -> Option<(usize, &str)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    line[indent..]
        .strip_prefix("```")
        .map(|info| (indent, info.trim()))
}

/// Every fenced block of `page`, and its lines outside any block (with
/// their line numbers) for the link and heading checks.
fn parse(page: &Path) -> (Vec<Block>, Vec<(usize, String)>) {
    let text = std::fs::read_to_string(page).unwrap();
    let mut blocks = Vec::new();
    let mut prose = Vec::new();
    let mut open: Option<(usize, usize, String, Vec<String>)> = None;
    for (n, line) in text.lines().enumerate() {
        let number = n + 1;
        match (&mut open, fence(line)) {
            (None, Some((indent, info))) => open = Some((number, indent, info.into(), Vec::new())),
            (None, None) => prose.push((number, line.to_string())),
            (Some(_), Some((_, ""))) => {
                let (line, _, info, body) = open.take().unwrap();
                blocks.push(Block {
                    page: shown(page),
                    line,
                    info,
                    text: body.join("\n") + "\n",
                });
            }
            (Some((_, indent, _, body)), _) => {
                let cut = line.len() - line.trim_start_matches(' ').len();
                body.push(line[cut.min(*indent)..].to_string());
            }
        }
    }
    assert!(
        open.is_none(),
        "{}: a code block is never closed",
        shown(page)
    );
    (blocks, prose)
}

/// The names of the `${VAR}` references in `text` (defaults included).
fn env_references(text: &str) -> BTreeSet<String> {
    text.split("${")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// Every `toml npcagent` block of the README and the guide is a complete
/// manifest that `npc validate` (the real binary, in a fresh git
/// repository, with the variables it names unset) finds valid: no error,
/// and no warning but the unset variables `--allow-missing-env` allows.
/// Every other TOML block is marked as no manifest, so a new example cannot
/// skip the check by its fence.
#[test]
fn every_manifest_example_in_the_guide_validates() {
    let mut manifests = Vec::new();
    for page in pages() {
        for block in parse(&page).0 {
            if block.info == MANIFEST_FENCE {
                manifests.push(block);
            } else if block.info.starts_with("toml") {
                assert!(
                    [INVALID_FENCE, OTHER_TOML_FENCE].contains(&block.info.as_str()),
                    "{}:{}: a TOML block is a manifest (```{MANIFEST_FENCE}, validated), a \
                     deliberate error (```{INVALID_FENCE}) or marked ```{OTHER_TOML_FENCE}",
                    block.page,
                    block.line
                );
            }
        }
    }
    assert!(
        manifests.len() >= MIN_MANIFEST_BLOCKS,
        "only {} manifest examples found: {manifests:?}",
        manifests.len()
    );
    for block in &manifests {
        let at = format!("{}:{}", block.page, block.line);
        let variables = env_references(&block.text);
        let mut args = vec!["--format", "json"];
        if !variables.is_empty() {
            args.push("--allow-missing-env");
        }
        let (code, printed) = validate(&block.text, &args);
        let report: Value = serde_json::from_str(&printed)
            .unwrap_or_else(|e| panic!("{at}: validate printed no JSON ({e}): {printed}"));
        assert_eq!(code, Some(0), "{at}: {report:#}");
        assert_eq!(report["valid"], true, "{at}: {report:#}");
        assert_eq!(report["error_count"], 0, "{at}: {report:#}");
        for diagnostic in report["diagnostics"].as_array().unwrap() {
            let summary = diagnostic["summary"].as_str().unwrap();
            assert!(
                variables.iter().any(|name| summary
                    .starts_with(&format!("environment variable `{name}` is not set"))),
                "{at}: an example in the guide draws a warning: {diagnostic:#}"
            );
        }
    }
}

/// `npc validate ARGS` of `manifest` in a fresh git repository, with the
/// variables it names unset: its exit code and standard output.
fn validate(manifest: &str, args: &[&str]) -> (Option<i32>, String) {
    let repo = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    git(repo.path(), &["init", "--quiet"]);
    std::fs::write(repo.path().join("npcagent.toml"), manifest).unwrap();
    let mut command = npc();
    command
        .current_dir(repo.path())
        .arg("validate")
        .args(args)
        .env("XDG_DATA_HOME", data.path());
    for name in env_references(manifest) {
        command.env_remove(name);
    }
    let out = command.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Every deliberate error the guide shows (```toml npcagent-invalid) fails
/// `npc validate` with exit 1, and the blocks after it (```text
/// npc-validate, ```json npc-validate; at least one) are exactly what it
/// prints, so a changed diagnostic cannot leave a stale one in the guide.
#[test]
fn every_deliberate_error_in_the_guide_fails_as_shown() {
    let mut shown = 0;
    for page in pages() {
        let blocks = parse(&page).0;
        for (i, block) in blocks.iter().enumerate() {
            let at = format!("{}:{}", block.page, block.line);
            if block.info == VALIDATE_TEXT_FENCE || block.info == VALIDATE_JSON_FENCE {
                let shown_for = blocks[..i]
                    .iter()
                    .rev()
                    .find(|b| b.info.starts_with("toml"));
                assert!(
                    shown_for.is_some_and(|b| b.info == INVALID_FENCE),
                    "{at}: what `npc validate` prints follows the ```{INVALID_FENCE} block it is for"
                );
                continue;
            }
            if block.info != INVALID_FENCE {
                continue;
            }
            let outputs: Vec<&Block> = blocks[i + 1..]
                .iter()
                .take_while(|b| !b.info.starts_with("toml"))
                .filter(|b| b.info == VALIDATE_TEXT_FENCE || b.info == VALIDATE_JSON_FENCE)
                .collect();
            assert!(
                !outputs.is_empty(),
                "{at}: a deliberate error is followed by what `npc validate` prints for it"
            );
            for output in outputs {
                let json = output.info == VALIDATE_JSON_FENCE;
                let format: &[&str] = if json { &["--format", "json"] } else { &[] };
                let (code, printed) = validate(&block.text, format);
                assert_eq!(code, Some(1), "{at}: {printed}");
                if json {
                    let want: Value = serde_json::from_str(&output.text).unwrap();
                    let got: Value = serde_json::from_str(&printed).unwrap();
                    assert_eq!(
                        got, want,
                        "{}:{}: `npc validate --format json` prints {got}",
                        output.page, output.line
                    );
                } else {
                    assert_eq!(
                        printed.trim_end(),
                        output.text.trim_end(),
                        "{}:{}: `npc validate` prints:\n{printed}",
                        output.page,
                        output.line
                    );
                }
                shown += 1;
            }
        }
    }
    assert!(shown >= 2, "only {shown} deliberate errors shown");
}

/// The `npc` command lines of a page: each line of an `sh` block that runs
/// `npc` (after any `VAR=value`; its comment and a trailing `&` cut), and
/// each inline code span of its prose that starts with `npc ` and holds no
/// synopsis notation. Internal subcommands (`npc __…`) are left out.
fn command_lines(page: &Path) -> Vec<(usize, String)> {
    let (blocks, prose) = parse(page);
    let mut found = Vec::new();
    for block in blocks.iter().filter(|b| b.info == "sh") {
        for (n, line) in block.text.lines().enumerate() {
            let line = line
                .split(" #")
                .next()
                .unwrap()
                .trim()
                .trim_end_matches('&');
            let words: Vec<&str> = line
                .split_whitespace()
                .skip_while(|w| w.contains('=') && !w.starts_with('-'))
                .collect();
            if words.first() == Some(&"npc") {
                found.push((block.line + 1 + n, words.join(" ")));
            }
        }
    }
    for (number, paragraph) in paragraphs(&prose) {
        for span in paragraph.split('`').skip(1).step_by(2) {
            if span.starts_with("npc ") && !span.starts_with("npc __") && !span.contains(NOTATION) {
                found.push((number, span.to_string()));
            }
        }
    }
    found
}

/// The paragraphs of a page's prose (runs of consecutive non-blank lines),
/// each joined into one line as Markdown renders it (a code span may wrap),
/// with the number of its first line.
fn paragraphs(prose: &[(usize, String)]) -> Vec<(usize, String)> {
    let mut found: Vec<(usize, String)> = Vec::new();
    let mut last = 0;
    for (number, line) in prose {
        let line = line.trim();
        if line.is_empty() {
            last = 0;
            continue;
        }
        match found.last_mut() {
            Some((_, text)) if last + 1 == *number => {
                text.push(' ');
                text.push_str(line);
            }
            _ => found.push((*number, line.to_string())),
        }
        last = *number;
    }
    found
}

/// Why the command line `npc WORDS` does not parse with the current CLI,
/// or `None` when it does: `npc WORDS --help` exits 0 (clap reads the
/// words before `--help` first, so an unknown subcommand, an unknown option
/// or a bad value fails). Placeholders in capitals that the command line
/// checks are given sample values first.
fn parse_failure(words: &[&str], scratch: &Path) -> Option<String> {
    let args: Vec<&str> = words
        .iter()
        .map(|word| {
            PLACEHOLDERS
                .iter()
                .find(|(name, _)| name == word)
                .map_or(*word, |(_, sample)| sample)
        })
        .chain(["--help"])
        .collect();
    let out = npc().current_dir(scratch).args(&args).output().unwrap();
    (out.status.code() != Some(0)).then(|| {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    })
}

/// Every `npc …` command line the README and `docs/` show parses with the
/// current command line ([`parse_failure`]).
#[test]
fn every_command_line_in_the_docs_parses() {
    let scratch = tempfile::tempdir().unwrap();
    let mut checked = BTreeSet::new();
    let mut failed = Vec::new();
    for page in pages() {
        for (number, line) in command_lines(&page) {
            if !checked.insert(line.clone()) {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().skip(1).collect();
            if let Some(why) = parse_failure(&words, scratch.path()) {
                failed.push(format!("{}:{number}: `{line}`: {why}", shown(&page)));
            }
        }
    }
    assert!(
        checked.len() >= MIN_COMMAND_LINES,
        "only {} command lines found: {checked:?}",
        checked.len()
    );
    assert!(
        failed.is_empty(),
        "command lines that do not parse:\n{}",
        failed.join("\n")
    );
}

/// The heading of a man page's exit statuses.
const EXIT_STATUS_HEADING: &str = ".SH \"EXIT STATUS\"";
/// The heading of a man page's examples.
const EXAMPLES_HEADING: &str = ".SH EXAMPLES";

/// The lines of one `.SH` section of a man page (up to the next `.SH`).
fn man_section<'a>(page: &'a str, heading: &str) -> Vec<&'a str> {
    page.lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| !l.starts_with(".SH "))
        .collect()
}

/// The command lines of a man page's EXAMPLES (its `.nf` blocks), as a
/// shell reads them: roff's escapes undone, then split into words.
fn man_examples(page: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut literal = false;
    for line in man_section(page, EXAMPLES_HEADING) {
        match line {
            ".nf" => literal = true,
            ".fi" => literal = false,
            _ if literal => {
                let line = line
                    .replace("\\-", "-")
                    .replace("\\*(Aq", "'")
                    .replace("\\e", "\\");
                found.push(shell_words::split(&line).unwrap());
            }
            _ => {}
        }
    }
    found
}

/// Every command's man page (`man/man1/`, which another test holds to the
/// generated ones) has an EXIT STATUS section and an EXAMPLES section, and
/// every example parses with the current command line.
#[test]
fn every_man_page_has_exit_statuses_and_examples_that_parse() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = repo_root().join("man/man1");
    let mut failed = Vec::new();
    let mut pages = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let page = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        pages += 1;
        let statuses = man_section(&page, EXIT_STATUS_HEADING);
        assert!(
            statuses.contains(&"\\fB0\\fR"),
            "{name}: no EXIT STATUS with status 0"
        );
        let examples = man_examples(&page);
        assert!(!examples.is_empty(), "{name}: no EXAMPLES");
        for words in examples {
            assert_eq!(words[0], "npc", "{name}: `{words:?}` does not run npc");
            let rest: Vec<&str> = words[1..].iter().map(String::as_str).collect();
            if let Some(why) = parse_failure(&rest, scratch.path()) {
                failed.push(format!("{name}: `{}`: {why}", words.join(" ")));
            }
        }
    }
    assert!(pages >= MIN_MAN_PAGES, "only {pages} pages under man/man1");
    assert!(
        failed.is_empty(),
        "examples that do not parse:\n{}",
        failed.join("\n")
    );
}

/// The exit codes of the guide's table (`docs/guide/commands.md`) are the
/// ones `npc(1)` lists, which come from the command line's one table.
#[test]
fn the_guides_exit_codes_are_the_command_lines() {
    let guide = std::fs::read_to_string(repo_root().join("docs/guide/commands.md")).unwrap();
    let table: BTreeSet<String> = guide
        .lines()
        .skip_while(|l| *l != "## Exit codes")
        .take_while(|l| !l.starts_with("## Output"))
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" |").next())
        .filter(|code| code.chars().all(|c| c.is_ascii_digit()))
        .map(str::to_string)
        .collect();
    let page = std::fs::read_to_string(repo_root().join("man/man1/npc.1")).unwrap();
    let listed: BTreeSet<String> = man_section(&page, EXIT_STATUS_HEADING)
        .iter()
        .filter_map(|l| l.strip_prefix("\\fB")?.strip_suffix("\\fR"))
        .map(str::to_string)
        .collect();
    assert!(listed.len() >= 3, "npc(1) lists {listed:?}");
    assert_eq!(table, listed, "the guide's exit codes differ from npc(1)'s");
}

/// A heading's anchor as GitHub makes it: lower case, punctuation but `-`
/// and `_` dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown page: its headings' (a repeated one gets
/// `-1`, `-2`, … as on GitHub) and every `id="…"` it sets.
fn anchors(page: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (_, line) in parse(page).1 {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let mut anchor = base.clone();
            let mut n = 0;
            while found.contains(&anchor) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
            found.insert(anchor);
        }
        for rest in line.split("id=\"").skip(1) {
            if let Some((id, _)) = rest.split_once('"') {
                found.insert(id.to_string());
            }
        }
    }
    found
}

/// The targets of the inline links `[text](target)` on a line of prose.
fn link_targets(line: &str) -> Vec<String> {
    line.split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target.to_string()))
        .collect()
}

/// Every relative link in the README and `docs/` (outside code blocks)
/// names a file or directory of the repository that exists, and an
/// `#anchor` on a Markdown page names one of its headings.
#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = repo_root().canonicalize().unwrap();
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in pages() {
        let dir = page.parent().unwrap();
        for (number, line) in parse(&page).1 {
            for target in link_targets(&line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let at = format!("{}:{number}: `{target}`", shown(&page));
                let (file, anchor) = match target.split_once('#') {
                    Some((file, anchor)) => (file, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let path = if file.is_empty() {
                    page.clone()
                } else {
                    dir.join(file)
                };
                let Ok(real) = path.canonicalize() else {
                    broken.push(format!("{at}: no such file"));
                    continue;
                };
                if !real.starts_with(&root) {
                    broken.push(format!("{at}: outside the repository"));
                    continue;
                }
                if let Some(anchor) = anchor
                    && real.extension().is_some_and(|e| e == "md")
                    && !anchors(&real).contains(anchor)
                {
                    broken.push(format!("{at}: no heading `#{anchor}` there"));
                }
            }
        }
    }
    assert!(
        checked >= MIN_RELATIVE_LINKS,
        "only {checked} relative links found"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The README is a front page: at most 12 KB, its first code block the
/// two commands (the demo daemon, the whole test suite), and CI's
/// `.ci/run` runs the very test command it gives.
#[test]
fn the_readme_is_short_and_gives_the_commands_ci_runs() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    assert!(
        readme.len() <= README_MAX_BYTES,
        "README.md is {} bytes, more than {README_MAX_BYTES}: move the detail into docs/guide/",
        readme.len()
    );
    let first = parse(&repo_root().join("README.md"))
        .0
        .into_iter()
        .next()
        .expect("README.md has a code block");
    assert_eq!(first.info, "sh", "{first:?}");
    let commands: Vec<&str> = first
        .text
        .lines()
        .map(|line| line.split(" #").next().unwrap().trim())
        .collect();
    assert_eq!(
        commands,
        [
            "cargo run --release -- daemon -m examples/demo/npcagent.toml",
            "cargo test --no-fail-fast"
        ],
        "README.md's first block: the demo daemon, then the test suite"
    );
    let ci = std::fs::read_to_string(repo_root().join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|line| line.trim() == commands[1]),
        ".ci/run does not run README.md's test command `{}`",
        commands[1]
    );
    assert!(
        repo_root()
            .join(commands[0].rsplit(' ').next().unwrap())
            .is_file(),
        "the demo manifest the first command names is missing"
    );
}

/// No page a user reads (the README, the guide, the man pages, the
/// schemas, the examples, the dashboard, the files `npc init` and `npc
/// plugin init` write) names an internal seed document or another
/// product's code name.
#[test]
fn no_internal_name_reaches_the_user_facing_docs() {
    fn walk(path: &Path, into: &mut Vec<PathBuf>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                walk(&entry.unwrap().path(), into);
            }
        } else {
            into.push(path.to_path_buf());
        }
    }
    let mut files = Vec::new();
    for top in [
        "README.md",
        "docs",
        "man",
        "schemas",
        "examples",
        "src/plugins/schemas",
        "src/plugins/scaffold",
        "src/api/assets",
        "src/cli/starter.toml",
    ] {
        walk(&repo_root().join(top), &mut files);
    }
    let mut found = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for name in INTERNAL_NAMES {
            if text.contains(name) {
                found.push(format!("{}: `{name}`", shown(file)));
            }
        }
    }
    assert!(files.len() > 50, "{files:?}");
    assert!(found.is_empty(), "internal names:\n{}", found.join("\n"));
}

/// The readers above agree with GitHub on the cases the guide uses: a
/// heading with code and punctuation, a link beside inline code, an
/// indented fence.
#[test]
fn the_link_and_fence_readers_see_what_github_shows() {
    assert_eq!(
        slug("`ask_tools`: approval required"),
        "ask_tools-approval-required"
    );
    assert_eq!(
        slug("Editors (Agent Client Protocol)"),
        "editors-agent-client-protocol"
    );
    assert_eq!(
        link_targets("see [a](x.md#b) and [`c`](../y/) or `d`"),
        ["x.md#b", "../y/"]
    );
    assert_eq!(fence("  ```toml npcagent"), Some((2, "toml npcagent")));
    assert_eq!(fence("text ```"), None);
    assert_eq!(
        env_references("a = \"${A}\" b = \"${B_2:-x}\""),
        ["A", "B_2"].map(String::from).into()
    );
}
