use super::*;

#[test]
fn run_ids_are_unique_sortable_and_valid_components() {
    let a = new_run_id();
    let b = new_run_id();
    assert_ne!(a, b);
    assert!(a.starts_with(RUN_ID_PREFIX));
    assert!(
        a.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'),
        "{a}"
    );
    assert_eq!(a.len(), b.len());
}

#[test]
fn outcomes_map_to_exit_codes() {
    assert_eq!(Outcome::Succeeded.exit_code(), 0);
    let exit = ExitInfo {
        code: Some(3),
        signal: None,
    };
    assert_eq!(Outcome::Failed { exit }.exit_code(), 1);
    assert_eq!(Outcome::TimedOut.exit_code(), 124);
    assert_eq!(Outcome::Cancelled { signal: 2 }.exit_code(), 130);
    assert_eq!(Outcome::Cancelled { signal: 15 }.exit_code(), 143);
}

#[test]
fn event_payload_carries_type_and_run_id() {
    let e = AgentEvent::Message {
        text: "hi".into(),
        delta: false,
    };
    let v = event_payload("run-1", &e);
    assert_eq!(v["type"], "agent.message");
    assert_eq!(v["run_id"], "run-1");
    assert_eq!(v["text"], "hi");
}
