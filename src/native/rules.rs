//! The repository's agent instructions (`[instructions]`, rendered like a
//! prompt) as a managed block in each declared CLI's rules file, checked
//! against the installed CLIs:
//! - Codex CLI (0.171) and OpenCode (1.18): `AGENTS.md` at the repository
//!   root (both read it; OpenCode falls back to `CLAUDE.md` only without one).
//! - Claude Code (2.1): `CLAUDE.md`.
//! - Gemini CLI (0.61): `GEMINI.md`. Its `context.fileName` setting could
//!   point it at `AGENTS.md` instead, but that replaces the user's own list
//!   of context files, so npc keeps its block in `GEMINI.md` (a user who
//!   set `context.fileName` without `GEMINI.md` does not see it).
//!
//! The block is npc's text between [`BEGIN`] and [`END`] (whole lines).
//! It goes first in a file that has none (a stable prefix), followed by one
//! blank line, and every byte outside it is the user's and kept as it is:
//! removing the block (the manifest dropped `[instructions]`, or the CLI)
//! gives back the user's file byte for byte, and a file that held only the
//! block is removed. A file with a broken block (a begin without its end,
//! two blocks) is reported and left alone.

use std::path::Path;

use serde_json::Value;

use crate::model::ProviderKind;

/// The line opening npc's block.
pub const BEGIN: &str =
    "<!-- npc:begin (managed by npc from the manifest's [instructions]; edit it there) -->";
/// The line closing npc's block.
pub const END: &str = "<!-- npc:end -->";
/// Every rules file npc may keep a block in, relative to the repository.
pub const RULES_FILES: [&str; 3] = ["AGENTS.md", "CLAUDE.md", "GEMINI.md"];

/// The rules file `kind`'s CLI reads.
pub fn rules_file(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Codex | ProviderKind::Opencode => RULES_FILES[0],
        ProviderKind::ClaudeCode => RULES_FILES[1],
        ProviderKind::GeminiCli => RULES_FILES[2],
    }
}

/// A note when Gemini CLI's settings (`text` of `.gemini/settings.json`)
/// name context files without `GEMINI.md`: it does not read npc's block.
pub fn gemini_context_note(path: &Path, text: &str) -> Option<String> {
    let (root, _) = super::edit::parse_native_json(path, ProviderKind::GeminiCli, text).ok()?;
    let names = root.get("context")?.get("fileName")?;
    let reads = match names {
        Value::String(s) => s == RULES_FILES[2],
        Value::Array(a) => a.iter().any(|v| v.as_str() == Some(RULES_FILES[2])),
        _ => return None,
    };
    (!reads).then(|| {
        format!(
            "`.gemini/settings.json` sets `context.fileName` without `{}`: Gemini CLI does not read npc's block; add it to the list",
            RULES_FILES[2]
        )
    })
}

/// Why a rules file cannot be edited.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error(
        "npc's block opens on line {line} but never closes (`{END}`); fix or delete it by hand"
    )]
    Unclosed { line: usize },
    #[error("the file holds more than one npc block (line {line}); keep one by hand")]
    Twice { line: usize },
}

/// Byte range of npc's block in `text` (whole lines, the end line's
/// newline included), if it has one.
fn find(text: &str) -> Result<Option<(usize, usize)>, BlockError> {
    let mut start = None;
    let mut found = None;
    let mut offset = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let bare = bare(line);
        if bare == BEGIN {
            if start.is_some() || found.is_some() {
                return Err(BlockError::Twice { line: index + 1 });
            }
            start = Some((offset, index + 1));
        } else if bare == END
            && let Some((s, _)) = start.take()
        {
            found = Some((s, offset + line.len()));
        }
        offset += line.len();
    }
    match start {
        Some((_, line)) => Err(BlockError::Unclosed { line }),
        None => Ok(found),
    }
}

/// `line` without its newline and carriage return.
fn bare(line: &str) -> &str {
    let line = line.strip_suffix('\n').unwrap_or(line);
    line.strip_suffix('\r').unwrap_or(line)
}

/// Whether `line` is one of npc's marker lines.
fn is_marker(line: &str) -> bool {
    matches!(bare(line), BEGIN | END)
}

/// The block holding `body`. A line of `body` that is one of npc's marker
/// lines (the manifest's text quoting them) gets one space in front, so it
/// reads the same but no longer opens or closes the block: otherwise the
/// block would end at the quoted end line, and every apply would put a
/// new block before the rest of the old one.
fn block(body: &str) -> String {
    let mut out = String::with_capacity(BEGIN.len() + END.len() + body.len() + 3);
    out.push_str(BEGIN);
    out.push('\n');
    for line in body.split_inclusive('\n') {
        if is_marker(line) {
            out.push(' ');
        }
        out.push_str(line);
    }
    if !body.is_empty() && !body.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(END);
    out.push('\n');
    out
}

/// The rules file's text (`before`, `None` when absent) with npc's block
/// holding `body`, or without a block when `body` is `None`. `Ok(None)`:
/// the file is not there afterwards (it held only the block, or nothing
/// was due).
pub fn edit(before: Option<&str>, body: Option<&str>) -> Result<Option<String>, BlockError> {
    let text = before.unwrap_or("");
    let existing = find(text)?;
    let after = match (existing, body) {
        (Some((start, end)), Some(body)) => {
            format!("{}{}{}", &text[..start], block(body), &text[end..])
        }
        (Some((start, end)), None) => {
            // The blank line npc put after its block goes with it.
            let rest = &text[end..];
            let rest = if start == 0 {
                rest.strip_prefix('\n').unwrap_or(rest)
            } else {
                rest
            };
            format!("{}{rest}", &text[..start])
        }
        (None, Some(body)) if text.is_empty() => block(body),
        (None, Some(body)) => format!("{}\n{text}", block(body)),
        (None, None) => return Ok(before.map(str::to_string)),
    };
    Ok((!after.is_empty() || before.is_some_and(|b| b.is_empty())).then_some(after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_goes_first_and_leaves_the_users_text_byte_for_byte() {
        let user = "# Mine\n\nno trailing newline";
        let with = edit(Some(user), Some("Be brief.")).unwrap().unwrap();
        assert_eq!(with, format!("{BEGIN}\nBe brief.\n{END}\n\n{user}"));
        // Updated in place, and idempotent.
        let updated = edit(Some(&with), Some("Be terse.\n")).unwrap().unwrap();
        assert_eq!(updated, format!("{BEGIN}\nBe terse.\n{END}\n\n{user}"));
        assert_eq!(
            edit(Some(&updated), Some("Be terse.\n")).unwrap().unwrap(),
            updated
        );
        // Removed: the user's bytes exactly.
        assert_eq!(edit(Some(&updated), None).unwrap().unwrap(), user);
    }

    #[test]
    fn a_block_the_user_moved_stays_where_it_is() {
        let text = format!("top\r\n{BEGIN}\r\nold\r\n{END}\r\nbottom\n");
        let after = edit(Some(&text), Some("new")).unwrap().unwrap();
        assert_eq!(after, format!("top\r\n{BEGIN}\nnew\n{END}\nbottom\n"));
        assert_eq!(
            edit(Some(&after), None).unwrap().unwrap(),
            "top\r\nbottom\n"
        );
    }

    #[test]
    fn a_file_of_only_the_block_is_created_and_removed() {
        let created = edit(None, Some("x")).unwrap().unwrap();
        assert_eq!(created, format!("{BEGIN}\nx\n{END}\n"));
        assert_eq!(edit(Some(&created), None).unwrap(), None);
        assert_eq!(edit(None, None).unwrap(), None);
        assert_eq!(edit(Some(""), None).unwrap().as_deref(), Some(""));
    }

    #[test]
    fn gemini_settings_that_skip_gemini_md_get_a_note() {
        let path = Path::new(".gemini/settings.json");
        assert!(gemini_context_note(path, r#"{"context":{"fileName":["AGENTS.md"]}}"#).is_some());
        assert!(gemini_context_note(path, r#"{"context":{"fileName":"GEMINI.md"}}"#).is_none());
        assert!(gemini_context_note(path, "{\n // c\n \"mcpServers\": {}}").is_none());
        assert!(gemini_context_note(path, "not json").is_none());
    }

    #[test]
    fn broken_blocks_are_refused() {
        let unclosed = format!("a\n{BEGIN}\nb\n");
        assert_eq!(
            edit(Some(&unclosed), Some("x")),
            Err(BlockError::Unclosed { line: 2 })
        );
        let twice = format!("{BEGIN}\n{END}\n{BEGIN}\n{END}\n");
        assert_eq!(edit(Some(&twice), None), Err(BlockError::Twice { line: 3 }));
        // An end marker alone is the user's text.
        let stray = format!("{END}\n");
        assert_eq!(edit(Some(&stray), None).unwrap().unwrap(), stray);
    }

    #[test]
    fn marker_lines_in_the_body_do_not_break_the_block() {
        let body = format!("keep\n{END}\n{BEGIN}\r\nafter");
        let once = edit(Some("mine\n"), Some(&body)).unwrap().unwrap();
        assert_eq!(
            once,
            format!("{BEGIN}\nkeep\n {END}\n {BEGIN}\r\nafter\n{END}\n\nmine\n")
        );
        let twice = edit(Some(&once), Some(&body)).unwrap().unwrap();
        assert_eq!(twice, once);
        assert_eq!(edit(Some(&once), None).unwrap().unwrap(), "mine\n");
    }
}
