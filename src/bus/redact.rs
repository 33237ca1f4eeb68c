//! Secret scrubbing for event payloads. Model types already serialize secret
//! [`crate::model::Text`] as `<redacted>`; this is the second line of
//! defence: every occurrence of a known secret value inside a string value
//! of a JSON document is replaced before the event is persisted.
//!
//! Scrubbing is exact in two ways. It touches values only: object keys are
//! names (environment variable names, component ids, field names), never
//! secrets, and rewriting them would corrupt the event. And it searches only
//! for secrets of at least [`MIN_SCRUBBED_SECRET_CHARS`] characters: a
//! shorter value (`RT_DEBUG=e`) is not a credential, and replacing every `e`
//! in every string would destroy the event while hiding nothing. Such a
//! value still never prints in its own field, where `Text` shows `<redacted>`.

use crate::model::text::REDACTED;

/// Shortest secret value searched for inside other strings, in characters.
/// Real credentials (tokens, keys, passwords) are longer; a shorter value
/// would match by accident in ordinary text.
pub const MIN_SCRUBBED_SECRET_CHARS: usize = 8;

/// Replace every occurrence of each secret of at least
/// [`MIN_SCRUBBED_SECRET_CHARS`] characters in the string values of `value`
/// (not object keys) with `<redacted>`. Longer secrets are replaced first,
/// so a secret containing a shorter one leaves no tail behind. Returns
/// whether anything was replaced.
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
        .filter(|s| s.chars().count() >= MIN_SCRUBBED_SECRET_CHARS)
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
        Value::Object(map) => map
            .values_mut()
            .fold(false, |changed, item| redact_value(item, secrets) | changed),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn replaces_secrets_in_nested_string_values_not_keys() {
        let mut value = json!({
            "url": "https://x/?token=s3cr3t-T0KEN",
            "list": [1, "a s3cr3t-T0KEN b", {"deep": "s3cr3t-T0KEN"}],
            "n": 3,
        });
        assert!(redact_json(&mut value, &["s3cr3t-T0KEN"]));
        let text = value.to_string();
        assert!(!text.contains("s3cr3t-T0KEN"), "{text}");
        assert_eq!(value["url"], "https://x/?token=<redacted>");
        assert_eq!(value["list"][2]["deep"], "<redacted>");
        assert_eq!(value["n"], 3);
    }

    #[test]
    fn keys_and_short_values_are_never_rewritten() {
        let mut value = json!({
            "mcp_server.s1": { "env": { "RT_DEBUG": "e" }, "component": "mcp_server.s1" },
            "SECRET_NAME_12": "plain",
        });
        let before = value.clone();
        assert!(!redact_json(&mut value, &["e", "server", "SECRET_NAME_12"]));
        assert_eq!(value, before);
    }

    #[test]
    fn longer_secret_wins_over_its_prefix() {
        let mut value = json!("key=ABCDEFGHIJKL");
        redact_json(&mut value, &["ABCDEFGH", "ABCDEFGHIJKL"]);
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
            "[AB]{0,30}|[a-z0-9 =/]{0,24}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                prop::collection::btree_map("[a-z0-9]{0,10}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        // Secrets drawn from characters that neither `<redacted>` nor a
        // JSON number contains, so a replacement can never spell a secret
        // again and only strings can hold one; string values are often runs
        // of the same two letters, so secrets occur in them. Keys are
        // lowercase, so a secret found in the text was left in a value.
        #[test]
        fn no_secret_survives(
            mut value in json_value(),
            secrets in prop::collection::vec("[AB]{8,9}", 1..4),
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
