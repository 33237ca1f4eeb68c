//! Every kind has an example that round-trips and matches the schema.

use super::*;

#[test]
fn every_kind_has_an_example_that_round_trips() {
    let examples = Event::examples();
    assert_eq!(examples.len(), Event::KINDS.len());
    for (example, kind) in examples.into_iter().zip(Event::KINDS) {
        assert_eq!(example.kind(), *kind);
        let text = serde_json::to_string(&example).unwrap();
        let back: Event = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("`{kind}` does not read back ({e}): {text}");
        });
        assert_eq!(back, example, "`{kind}` changed on its way back: {text}");
    }
}

#[test]
fn every_example_matches_the_schema_as_it_is_stored() {
    let validator = jsonschema::validator_for(&json_schema()).expect("the schema compiles");
    for example in Event::examples() {
        let stored = NewEvent::from(example.clone());
        let row = serde_json::json!({ "kind": stored.kind(), "payload": stored.payload() });
        let errors: Vec<String> = validator.iter_errors(&row).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{row}: {errors:#?}");
    }
}

#[test]
fn kinds_are_unique_and_well_formed() {
    let mut seen = std::collections::BTreeSet::new();
    for kind in Event::KINDS {
        assert!(seen.insert(*kind), "`{kind}` twice");
        assert!(
            !kind.is_empty()
                && kind
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b)),
            "`{kind}`"
        );
    }
}

#[test]
fn the_stored_payload_is_the_struct_as_an_object_in_field_order() {
    let event = Event::RunQueued(RunQueued {
        run_id: "r1".into(),
        trigger: "t".into(),
        origin: "cron".into(),
        dedupe_key: None,
    });
    let stored = NewEvent::from(event).for_component("run/r1");
    assert_eq!(stored.kind(), "run.queued");
    assert_eq!(stored.component(), Some("run/r1"));
    assert_eq!(
        stored.payload().to_string(),
        r#"{"run_id":"r1","trigger":"t","origin":"cron","dedupe_key":null}"#
    );
}

#[test]
fn the_schema_refuses_an_unknown_kind_and_a_mistyped_field() {
    let validator = jsonschema::validator_for(&json_schema()).expect("the schema compiles");
    let unknown = serde_json::json!({ "kind": "run.exploded", "payload": {} });
    assert!(!validator.is_valid(&unknown));
    let mistyped = serde_json::json!({
        "kind": "run.queued",
        "payload": { "run_id": 5, "trigger": "t", "origin": "cron", "dedupe_key": null },
    });
    assert!(!validator.is_valid(&mistyped));
    let missing = serde_json::json!({ "kind": "pane.opened", "payload": { "id": 1 } });
    assert!(!validator.is_valid(&missing));
}
