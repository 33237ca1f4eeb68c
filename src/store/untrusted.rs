//! What a reader takes of a row another process wrote: a fleet's shared
//! PostgreSQL store is written by every machine of the fleet (and by
//! anyone who holds its URL), the user-level notice board by every daemon
//! of the user. Such rows are input, never npc's own: each text field is
//! cut in SQL (`left(col, N)` in PostgreSQL, `substr` in SQLite) so no
//! more than its bound ever reaches this process, a JSON field longer than
//! its bound comes back as `{"truncated_from_bytes": N}` instead, and a
//! page of rows stops at a byte budget. What comes back is made printable
//! here ([`crate::stdx::term::printable`]: every control character but
//! newline and tab as `\xNN`), so a relayed reason, error or name can
//! neither flood a reader nor drive a terminal.

use std::borrow::Cow;

use serde_json::Value;

/// Longest name read from a shared row, in characters: run ids, triggers,
/// origins, states, keys, workers, hosts, versions, remotes, commits.
pub const MAX_NAME_CHARS: usize = 256;
/// Longest free text read from a shared row, in characters: a run's detail
/// (its error), a worktree path.
pub const MAX_TEXT_CHARS: usize = 4_096;
/// Longest prompt read from a shared row, in characters (an `npc acp`
/// prompt's text as its session records it; the daemon takes at most
/// 32 KiB of one).
pub const MAX_PROMPT_CHARS: usize = 32 * 1024;
/// Longest event kind read (what `bus::MAX_EVENT_KIND_LEN` lets a writer
/// write).
pub const MAX_KIND_CHARS: usize = 128;
/// Longest event component read (`bus::MAX_COMPONENT_LEN`).
pub const MAX_COMPONENT_CHARS: usize = 512;
/// Longest event payload read, in bytes: a well-behaved writer cuts its
/// payloads to `bus::MAX_PAYLOAD_BYTES` (1 MiB), with room for the marker.
pub const MAX_EVENT_PAYLOAD_BYTES: usize = 1024 * 1024 + 4 * 1024;
/// Longest run payload a claim reads, in bytes: a webhook's body is at
/// most `model::MAX_WEBHOOK_BODY_BYTES` (16 MiB), and its JSON text may
/// grow by escapes. A longer one is refused, not run.
pub const MAX_CLAIMED_PAYLOAD_BYTES: usize = 2 * crate::model::MAX_WEBHOOK_BODY_BYTES as usize;
/// Longest run payload or result a listing reads, in bytes.
pub const MAX_LISTED_JSON_BYTES: usize = 64 * 1024;
/// Running runs a roster row lists at most.
pub const MAX_LISTED_RUNNING: usize = 100;
/// Bytes of payloads one page of rows reads at most (one row always).
pub const MAX_PAGE_BYTES: usize = 16 * 1024 * 1024;
/// The key of the object a JSON field over its bound is read as.
pub const TRUNCATED_KEY: &str = "truncated_from_bytes";

/// `text` with every control character but newline and tab escaped.
pub fn text(text: String) -> String {
    match crate::stdx::term::printable(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(shown) => shown,
    }
}

/// [`text`] of an optional field.
pub fn opt_text(field: Option<String>) -> Option<String> {
    field.map(text)
}

/// `value` with [`text`] applied to every string in it, keys included.
pub fn json(value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(text(s)),
        Value::Array(items) => Value::Array(items.into_iter().map(json).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (text(k), json(v)))
                .collect(),
        ),
        other => other,
    }
}

/// Whether `value` is what a JSON field over its bound is read as.
pub fn is_truncated(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|o| o.len() == 1 && o.contains_key(TRUNCATED_KEY))
}

/// PostgreSQL: text column `col` cut to `chars` characters.
pub fn pg_text(col: &str, chars: usize) -> String {
    format!("left({col}, {chars})")
}

/// PostgreSQL: JSON text column `col` as it is when at most `bytes` long,
/// else `{"truncated_from_bytes": N}` (NULL stays NULL).
pub fn pg_json(col: &str, bytes: usize) -> String {
    format!(
        "CASE WHEN {col} IS NULL OR octet_length({col}) <= {bytes} THEN {col} \
         ELSE json_build_object('{TRUNCATED_KEY}', octet_length({col}))::text END"
    )
}

/// PostgreSQL: the bytes column `col` reads as, at most `bytes` (0 for
/// NULL: `least` alone would skip it and answer `bytes`).
pub fn pg_size(col: &str, bytes: usize) -> String {
    format!("least(coalesce(octet_length({col}), 0), {bytes})")
}

/// PostgreSQL: the rows of `page` (a query that selects, in order, the
/// columns `columns` and a column `bytes`: a row's size) while the bytes
/// before each row stay within [`MAX_PAGE_BYTES`]: the first row always.
pub fn pg_budgeted(page: &str, columns: &str, order: &str) -> String {
    format!(
        "SELECT {columns} FROM (SELECT *, sum(bytes) OVER (ORDER BY {order}) - bytes AS before \
         FROM ({page}) AS page) AS sized WHERE before < {MAX_PAGE_BYTES} ORDER BY {order}"
    )
}

/// SQLite: text column `col` cut to `chars` characters.
pub fn sqlite_text(col: &str, chars: usize) -> String {
    format!("substr({col}, 1, {chars})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_escapes_controls_and_keeps_the_rest() {
        assert_eq!(text("a\x1b]52;c;x\x07b\n".into()), "a\\x1b]52;c;x\\x07b\n");
        assert_eq!(text("plain".into()), "plain");
    }

    #[test]
    fn json_escapes_every_string_and_key() {
        let v = serde_json::json!({ "k\x1b": ["\r", { "x": "\u{9b}2J" }], "n": 1 });
        let shown = json(v).to_string();
        assert!(
            !shown.contains("\\u001b") && !shown.contains('\u{9b}'),
            "{shown}"
        );
        assert!(shown.contains("k\\\\x1b"), "{shown}");
    }

    #[test]
    fn the_truncation_marker_is_recognised() {
        assert!(is_truncated(&serde_json::json!({ TRUNCATED_KEY: 5 })));
        assert!(!is_truncated(
            &serde_json::json!({ TRUNCATED_KEY: 5, "a": 1 })
        ));
    }
}
