//! Fitting an oversize event payload under the bus's payload limit instead
//! of refusing it: an event is never dropped for its size. The payload keeps
//! its shape and its beginning; what does not fit is cut, and every cut
//! leaves a marker: a string ends in [`TRUNCATED`], an array ends with a
//! `"…[truncated] N more items"` element, an object gets a [`TRUNCATED`] key
//! counting the entries dropped, and the payload itself gets
//! [`TRUNCATED_FROM_KEY`] with its original size in bytes.

use serde_json::{Map, Value};

/// What marks a cut in a truncated payload.
pub const TRUNCATED: &str = "…[truncated]";
/// Key added to a truncated payload, holding its original size in bytes.
pub const TRUNCATED_FROM_KEY: &str = "truncated_from_bytes";
/// Bytes kept free for the markers of one array or object.
const MARKER_ROOM: usize = 48;
/// Bytes kept free for the payload-level [`TRUNCATED_FROM_KEY`] entry (and
/// the wrapper around a payload that is not an object).
const TOP_MARKER_ROOM: usize = 64;
/// Below this many bytes of room an array or object takes no more items.
const MIN_ITEM_ROOM: usize = 8;

/// Cut `payload` so its JSON text is at most `limit` bytes, marking every
/// cut. `original` is the size it had. A payload that is not an object is
/// wrapped as `{"truncated_from_bytes": N, "value": …}`.
pub fn truncate_payload(payload: &mut Value, original: usize, limit: usize) {
    let budget = limit.saturating_sub(TOP_MARKER_ROOM);
    match payload {
        Value::Object(map) => {
            fit_object(map, budget);
            map.insert(TRUNCATED_FROM_KEY.into(), original.into());
        }
        other => {
            let mut inner = other.take();
            fit(&mut inner, budget);
            let mut map = Map::new();
            map.insert(TRUNCATED_FROM_KEY.into(), original.into());
            map.insert("value".into(), inner);
            *other = Value::Object(map);
        }
    }
}

/// Bytes of `value` as compact JSON.
pub(super) fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Bytes one character takes inside a JSON string.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Shrink `value` to at most `budget` bytes of JSON where it can (numbers,
/// booleans and null cannot shrink); returns its length afterwards.
fn fit(value: &mut Value, budget: usize) -> usize {
    let len = json_len(value);
    if len <= budget {
        return len;
    }
    match value {
        Value::String(text) => {
            let room = budget.saturating_sub(2 + TRUNCATED.len());
            let (mut used, mut end) = (0, 0);
            for (i, c) in text.char_indices() {
                if used + escaped_len(c) > room {
                    break;
                }
                used += escaped_len(c);
                end = i + c.len_utf8();
            }
            text.truncate(end);
            text.push_str(TRUNCATED);
        }
        Value::Array(items) => {
            let room = budget.saturating_sub(2 + MARKER_ROOM);
            let mut used = 0;
            let mut kept = 0;
            for item in items.iter_mut() {
                let comma = usize::from(kept > 0);
                let left = room.saturating_sub(used + comma);
                if left < MIN_ITEM_ROOM {
                    break;
                }
                let n = fit(item, left);
                if n > left {
                    break;
                }
                used += comma + n;
                kept += 1;
            }
            let dropped = items.len() - kept;
            items.truncate(kept);
            if dropped > 0 {
                items.push(Value::String(format!("{TRUNCATED} {dropped} more items")));
            }
        }
        Value::Object(map) => fit_object(map, budget),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
    json_len(value)
}

fn fit_object(map: &mut Map<String, Value>, budget: usize) {
    let room = budget.saturating_sub(2 + MARKER_ROOM);
    let mut used = 0;
    let mut kept = Map::new();
    let mut dropped = 0;
    for (key, mut item) in std::mem::take(map) {
        if dropped > 0 {
            dropped += 1;
            continue;
        }
        let comma = usize::from(!kept.is_empty());
        // The key, its quotes and the colon.
        let key_len = json_len(&Value::String(key.clone())) + 1;
        let left = room.saturating_sub(used + comma + key_len);
        let n = if left < MIN_ITEM_ROOM {
            usize::MAX
        } else {
            fit(&mut item, left)
        };
        if n > left {
            dropped = 1;
            continue;
        }
        used += comma + key_len + n;
        kept.insert(key, item);
    }
    if dropped > 0 {
        kept.insert(TRUNCATED.into(), dropped.into());
    }
    *map = kept;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_large_report_keeps_its_head_and_says_what_was_cut() {
        let diagnostics: Vec<Value> = (0..5000)
            .map(|i| json!({ "summary": format!("problem {i} {}", "x".repeat(600)) }))
            .collect();
        let mut payload = json!({ "reason": "edit", "report": { "error_count": 5000, "diagnostics": diagnostics } });
        let original = json_len(&payload);
        truncate_payload(&mut payload, original, 100_000);
        assert!(json_len(&payload) <= 100_000, "{}", json_len(&payload));
        assert_eq!(payload[TRUNCATED_FROM_KEY], original);
        assert_eq!(payload["reason"], "edit");
        assert_eq!(payload["report"]["error_count"], 5000);
        let kept = payload["report"]["diagnostics"].as_array().unwrap();
        assert!(
            kept[0]["summary"]
                .as_str()
                .unwrap()
                .starts_with("problem 0 ")
        );
        let last = kept.last().unwrap().as_str().unwrap();
        assert!(
            last.starts_with(TRUNCATED) && last.ends_with("more items"),
            "{last}"
        );
    }

    #[test]
    fn one_huge_string_is_cut_with_a_marker() {
        let mut payload = json!("\n".repeat(50_000));
        truncate_payload(&mut payload, 100_002, 1000);
        assert!(json_len(&payload) <= 1000);
        assert!(payload["value"].as_str().unwrap().ends_with(TRUNCATED));
        assert_eq!(payload[TRUNCATED_FROM_KEY], 100_002);
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            "\\PC{0,40}".prop_map(Value::from),
            "[\\x00-\\x1f\"\\\\]{0,20}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 128, 12, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..12).prop_map(Value::Array),
                prop::collection::btree_map("\\PC{0,8}", inner, 0..12)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn every_truncated_payload_fits(value in json_value(), limit in 200usize..2000) {
            let mut payload = value.clone();
            let original = json_len(&payload);
            if original > limit {
                truncate_payload(&mut payload, original, limit);
                prop_assert!(json_len(&payload) <= limit, "{} > {limit}: {payload}", json_len(&payload));
                prop_assert!(payload.get(TRUNCATED_FROM_KEY).is_some());
            }
        }
    }
}
