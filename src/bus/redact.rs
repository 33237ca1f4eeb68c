//! Secret scrubbing for event payloads. Model types already serialize secret
//! [`crate::model::Text`] as `<redacted>`; this is the second line of
//! defence: every occurrence of a known secret value, in any string or
//! object key of a JSON value, is replaced before the event is persisted.

use crate::model::text::REDACTED;

/// Replace every occurrence of each non-empty secret in the strings and
/// object keys of `value` with `<redacted>`. Longer secrets are replaced
/// first, so a secret containing a shorter one leaves no tail behind.
/// Returns whether anything was replaced.
pub fn redact_json<S: AsRef<str>>(value: &mut serde_json::Value, secrets: &[S]) -> bool {
    let secrets = ordered(secrets);
    if secrets.is_empty() {
        return false;
    }
    redact_value(value, &secrets)
}

/// [`redact_json`] for one string.
pub fn redact_str<S: AsRef<str>>(text: &str, secrets: &[S]) -> Option<String> {
    redact_text(text, &ordered(secrets))
}

fn ordered<S: AsRef<str>>(secrets: &[S]) -> Vec<&str> {
    let mut ordered: Vec<&str> = secrets
        .iter()
        .map(AsRef::as_ref)
        .filter(|s| !s.is_empty())
        .collect();
    ordered.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    ordered.dedup();
    ordered
}

fn redact_text(text: &str, secrets: &[&str]) -> Option<String> {
    let mut out: Option<String> = None;
    for secret in secrets {
        let current = out.as_deref().unwrap_or(text);
        if current.contains(secret) {
            out = Some(current.replace(secret, REDACTED));
        }
    }
    out
}

fn redact_value(value: &mut serde_json::Value, secrets: &[&str]) -> bool {
    use serde_json::Value;
    match value {
        Value::String(text) => match redact_text(text, secrets) {
            Some(clean) => {
                *text = clean;
                true
            }
            None => false,
        },
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, item| redact_value(item, secrets) | changed),
        Value::Object(map) => {
            let mut changed = false;
            if map.keys().any(|k| redact_text(k, secrets).is_some()) {
                let entries = std::mem::take(map);
                for (key, item) in entries {
                    let key = redact_text(&key, secrets).unwrap_or(key);
                    map.insert(key, item);
                }
                changed = true;
            }
            map.values_mut().fold(changed, |changed, item| {
                redact_value(item, secrets) | changed
            })
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn replaces_secrets_in_nested_strings_and_keys() {
        let mut value = json!({
            "url": "https://x/?token=s3cr3t-T0KEN",
            "s3cr3t-T0KEN": [1, "a s3cr3t-T0KEN b", {"deep": "s3cr3t-T0KEN"}],
            "n": 3,
        });
        assert!(redact_json(&mut value, &["s3cr3t-T0KEN"]));
        let text = value.to_string();
        assert!(!text.contains("s3cr3t-T0KEN"), "{text}");
        assert_eq!(value["url"], "https://x/?token=<redacted>");
        assert_eq!(value["<redacted>"][2]["deep"], "<redacted>");
        assert_eq!(value["n"], 3);
    }

    #[test]
    fn longer_secret_wins_over_its_prefix() {
        let mut value = json!("key=ABCDEF");
        redact_json(&mut value, &["ABC", "ABCDEF"]);
        assert_eq!(value, json!("key=<redacted>"));
    }

    #[test]
    fn empty_secrets_and_clean_values_change_nothing() {
        let mut value = json!({"a": "plain"});
        assert!(!redact_json(&mut value, &[""]));
        assert!(!redact_json(&mut value, &["absent"]));
        assert_eq!(value, json!({"a": "plain"}));
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<i64>().prop_map(serde_json::Value::from),
            "[A-Za-z0-9 =/]{0,24}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                prop::collection::btree_map("[A-Za-z0-9]{0,10}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        // Secrets drawn from characters that neither `<redacted>` nor a
        // JSON number contains, so a replacement can never spell a secret
        // again and only strings can hold one.
        #[test]
        fn no_secret_survives(
            mut value in json_value(),
            secrets in prop::collection::vec("[A-Z]{1,6}", 1..4),
        ) {
            redact_json(&mut value, &secrets);
            let text = value.to_string();
            for secret in &secrets {
                prop_assert!(!text.contains(secret.as_str()), "{secret} in {text}");
            }
        }

        #[test]
        fn values_without_secrets_are_untouched(value in json_value()) {
            let mut copy = value.clone();
            prop_assert!(!redact_json(&mut copy, &["<never-present>"]));
            prop_assert_eq!(copy, value);
        }
    }
}
