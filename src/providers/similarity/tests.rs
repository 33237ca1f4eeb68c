//! Unit tests of the difflib port: known ratios printed by Python and the
//! autojunk heuristic. The bit-for-bit comparison with python3's difflib on
//! generated inputs runs python3, so it lives with the integration tests
//! (`tests/integration/providers.rs`).

use super::*;
use proptest::prelude::*;

/// Expected values printed by Python 3's `SequenceMatcher(None, a, b).ratio()`.
#[test]
fn agrees_with_difflib_on_known_cases() {
    let cases: [(&str, &str, f64); 7] = [
        ("abcd", "bcde", 0.75),
        ("", "", 1.0),
        ("abc", "", 0.0),
        (
            "item.started|item,type",
            "item.completed|item,type",
            0.782608695652174,
        ),
        (
            "~text",
            "result|duration_ms,is_error,type",
            0.16216216216216217,
        ),
        (
            "private Thread currentThread;",
            "private volatile Thread currentThread;",
            0.8656716417910447,
        ),
        ("qabxcd", "abycdf", 0.6666666666666666),
    ];
    for (a, b, want) in cases {
        let got = str_similarity(a, b);
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "{a:?} vs {b:?}: {got} != {want}"
        );
    }
}

/// The autojunk heuristic is what makes difflib's ratio of two nearly
/// identical long strings over a small alphabet 0: every element is
/// popular, so only a match at the very start can grow (by extension).
/// Python: `SequenceMatcher(None, "ab"*150, "x" + "ab"*150).ratio() == 0.0`.
#[test]
fn autojunk_drops_popular_elements_of_long_sequences() {
    let a: Vec<char> = "ab".repeat(150).chars().collect();
    let b: Vec<char> = format!("x{}", "ab".repeat(150)).chars().collect();
    assert_eq!(SequenceMatcher::new(&a, &b).ratio(), 0.0);
    assert_eq!(
        SequenceMatcher::with_autojunk(&a, &b, false).ratio(),
        0.9983361064891847
    );
    // identical sequences still match whole, by extension from the start
    assert_eq!(SequenceMatcher::new(&a, &a).ratio(), 1.0);
    // below the threshold nothing is popular
    let short: Vec<char> = format!("x{}", "ab".repeat(99)).chars().collect();
    assert!(SequenceMatcher::new(&short[1..], &short).ratio() > 0.99);
}

#[test]
fn works_on_token_sequences() {
    let a = ["init", "message", "result"];
    let b = ["init", "message", "tool_use", "result"];
    assert_eq!(similarity(&a, &b), 6.0 / 7.0);
}

proptest! {
    #[test]
    fn bounded_and_reflexive_below_the_autojunk_length(a in "[a-dé]{0,30}", b in "[a-dé]{0,30}") {
        let r = str_similarity(&a, &b);
        prop_assert!((0.0..=1.0).contains(&r));
        prop_assert_eq!(str_similarity(&a, &a), 1.0);
    }
}
