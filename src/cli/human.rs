//! How the human views of the command line say times and events: one time
//! format everywhere (local time and how long ago; JSON output keeps the
//! stored milliseconds or RFC 3339), and an event as a line of `key=value`
//! fields instead of its raw JSON. Nothing here prints; the commands quote
//! what these return through [`crate::stdx::term::printable`].

use std::fmt::Write as _;

use chrono::{DateTime, Local};
use serde_json::Value;

/// Longest value one field of an event line shows, in characters.
pub const MAX_FIELD_CHARS: usize = 80;
/// Most fields one event line shows (then how many more).
pub const MAX_FIELDS: usize = 8;

/// `ms` (milliseconds since the epoch) as local time and its age from
/// `now_ms`: `2026-12-05 06:41:02 (3m ago)`.
pub fn when_at(ms: i64, now_ms: i64) -> String {
    let Some(t) = DateTime::from_timestamp_millis(ms) else {
        return "-".to_string();
    };
    let local = t.with_timezone(&Local).format("%Y-%m-%d %H:%M:%S");
    format!("{local} ({})", age(now_ms - ms))
}

/// [`when_at`] from now; `-` for none.
pub fn when(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".to_string(), |ms| when_at(ms, now_ms()))
}

/// A span of milliseconds as a person says it: `850ms`, `42s`, `5m 3s`,
/// `2h 5m`, `3d 4h`.
pub fn span(ms: i64) -> String {
    let ms = ms.max(0);
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// How long ago `ms` milliseconds is: `just now`, `42s ago`, `in 5m`.
fn age(ms: i64) -> String {
    const JUST_NOW_MS: i64 = 1000;
    if ms.abs() < JUST_NOW_MS {
        return "just now".to_string();
    }
    let s = ms.abs() / 1000;
    let short = match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    };
    if ms < 0 {
        format!("in {short}")
    } else {
        format!("{short} ago")
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// An event's payload as `key=value` fields, in its order: strings as they
/// are (quoted, controls escaped as `\u{1b}`, when they hold a space, a
/// quote, `=` or a control character), clipped to
/// [`MAX_FIELD_CHARS`]; lists and objects by their size; nulls left out;
/// at most [`MAX_FIELDS`] fields (then how many more).
pub fn fields(payload: &Value) -> String {
    let Value::Object(map) = payload else {
        return value(payload);
    };
    let shown: Vec<(&String, &Value)> = map.iter().filter(|(_, v)| !v.is_null()).collect();
    let mut out = String::new();
    for (key, v) in shown.iter().take(MAX_FIELDS) {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "{key}={}", value(v));
    }
    if shown.len() > MAX_FIELDS {
        let _ = write!(out, " (+{} more)", shown.len() - MAX_FIELDS);
    }
    out
}

/// One field's value as [`fields`] shows it.
fn value(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let clipped: String = s.chars().take(MAX_FIELD_CHARS).collect();
            let more = if s.chars().count() > MAX_FIELD_CHARS {
                "…"
            } else {
                ""
            };
            let plain = |c: char| !c.is_control() && !matches!(c, ' ' | '"' | '=' | '\\');
            if clipped.is_empty() || !clipped.chars().all(plain) {
                format!("{:?}", format!("{clipped}{more}"))
            } else {
                format!("{clipped}{more}")
            }
        }
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
            let listed: Vec<String> = items.iter().take(3).map(value).collect();
            let more = items.len().saturating_sub(3);
            if more > 0 {
                format!("[{} +{more}]", listed.join(","))
            } else {
                format!("[{}]", listed.join(","))
            }
        }
        Value::Array(items) => format!("[{} items]", items.len()),
        Value::Object(map) => format!("{{{} keys}}", map.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn times_read_as_local_time_and_age() {
        let now = 1_800_000_000_000;
        assert!(when_at(now - 180_000, now).ends_with(" (3m ago)"));
        assert!(when_at(now, now).ends_with(" (just now)"));
        assert!(when_at(now + 7_200_000, now).ends_with(" (in 2h)"));
        assert!(when_at(now - 3 * 86_400_000, now).ends_with(" (3d ago)"));
        // `YYYY-MM-DD HH:MM:SS`, whatever the zone.
        let shown = when_at(now, now);
        assert_eq!(shown.find(' '), Some(10), "{shown}");
        assert_eq!(when(None), "-");
        assert_eq!(span(850), "850ms");
        assert_eq!(span(42_000), "42s");
        assert_eq!(span(303_000), "5m 3s");
        assert_eq!(span(7_500_000), "2h 5m");
    }

    #[test]
    fn an_event_reads_as_fields_never_as_json() {
        let payload = json!({
            "run_id": "run-1",
            "tool": "Bash",
            "reason": "not on the list",
            "args": ["a", "b", "c", "d"],
            "result": {"x": 1, "y": 2},
            "gone": null,
            "ok": true,
        });
        assert_eq!(
            fields(&payload),
            "run_id=run-1 tool=Bash reason=\"not on the list\" args=[a,b,c +1] result={2 keys} ok=true"
        );
        let long = json!({ "detail": "x".repeat(500) });
        let shown = fields(&long);
        assert!(shown.chars().count() < MAX_FIELD_CHARS + 20, "{shown}");
        assert!(shown.ends_with('…'), "{shown}");
        let many: serde_json::Map<String, Value> =
            (0..12).map(|i| (format!("k{i}"), json!(i))).collect();
        assert!(fields(&Value::Object(many)).ends_with("(+4 more)"));
        // A control character never reaches the terminal raw.
        let hostile = fields(&json!({ "detail": "a\u{1b}]52;c;x\u{7}\u{9b}2J" }));
        assert_eq!(hostile, r#"detail="a\u{1b}]52;c;x\u{7}\u{9b}2J""#);
    }
}
