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

/// Deterministic xorshift, so a failing case can be reproduced.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One generated input: two strings (compared by character) or two token
/// lists, and the autojunk flag.
struct Case {
    a: Vec<String>,
    b: Vec<String>,
    chars: bool,
    autojunk: bool,
}

fn generate(rng: &mut Rng) -> Case {
    const ALPHABETS: [&[&str]; 4] = [
        &["a", "b"],
        &["a", "b", "c", "d", "e"],
        &["x", "y", "é", "→", "z", "|", ",", "."],
        &[
            "init",
            "message",
            "tool_use",
            "tool_result",
            "result",
            "error",
        ],
    ];
    let alphabet = ALPHABETS[rng.below(ALPHABETS.len())];
    // lengths on both sides of the autojunk threshold
    let max_len = [12, 60, 260, 450][rng.below(4)];
    let len_a = rng.below(max_len + 1);
    let a: Vec<String> = (0..len_a)
        .map(|_| alphabet[rng.below(alphabet.len())].to_string())
        .collect();
    // b is often an edited copy of a, so long matches occur
    let b: Vec<String> = if rng.below(2) == 0 {
        let mut b = a.clone();
        for _ in 0..rng.below(len_a / 4 + 2) {
            let at = rng.below(b.len() + 1);
            match rng.below(3) {
                0 if at < b.len() => {
                    b.remove(at);
                }
                1 => b.insert(at, alphabet[rng.below(alphabet.len())].to_string()),
                _ if at < b.len() => b[at] = alphabet[rng.below(alphabet.len())].to_string(),
                _ => {}
            }
        }
        b
    } else {
        let len_b = rng.below(max_len + 1);
        (0..len_b)
            .map(|_| alphabet[rng.below(alphabet.len())].to_string())
            .collect()
    };
    Case {
        a,
        b,
        chars: alphabet.iter().all(|s| s.chars().count() == 1),
        autojunk: rng.below(4) != 0,
    }
}

const PYTHON: &str = r#"
import difflib, json, struct, sys
out = []
for case in json.load(sys.stdin):
    a, b = case["a"], case["b"]
    if case["chars"]:
        a, b = "".join(a), "".join(b)
    m = difflib.SequenceMatcher(None, a, b, autojunk=case["autojunk"])
    blocks = [list(x) for x in m.get_matching_blocks()]
    bits = struct.unpack("<Q", struct.pack("<d", m.ratio()))[0]
    out.append({"blocks": blocks, "bits": str(bits)})
json.dump(out, sys.stdout)
"#;

/// Python's difflib and this port agree exactly — matching blocks and the
/// bits of the ratio — on generated inputs of every kind: short and long
/// (autojunk on and off), strings with multi-byte characters, token lists.
#[test]
fn agrees_bit_for_bit_with_python_difflib_on_generated_inputs() {
    const CASES: usize = 1500;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let cases: Vec<Case> = (0..CASES).map(|_| generate(&mut rng)).collect();
    let input: Vec<serde_json::Value> = cases
        .iter()
        .map(|c| serde_json::json!({"a": c.a, "b": c.b, "chars": c.chars, "autojunk": c.autojunk}))
        .collect();
    let mut child = std::process::Command::new("python3")
        .args(["-c", PYTHON])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (the difflib comparison needs it)");
    let body = serde_json::to_vec(&input).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &body));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "python3 failed");
    let answers: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answers.len(), CASES);
    let mut long_autojunk = 0;
    for (i, (case, want)) in cases.iter().zip(&answers).enumerate() {
        let (blocks, ratio) = if case.chars {
            let a: Vec<char> = case.a.concat().chars().collect();
            let b: Vec<char> = case.b.concat().chars().collect();
            let m = SequenceMatcher::with_autojunk(&a, &b, case.autojunk);
            (m.matching_blocks(), m.ratio())
        } else {
            let m = SequenceMatcher::with_autojunk(&case.a, &case.b, case.autojunk);
            (m.matching_blocks(), m.ratio())
        };
        let blocks: Vec<[usize; 3]> = blocks.iter().map(|m| [m.a, m.b, m.size]).collect();
        let want_blocks: Vec<[usize; 3]> = serde_json::from_value(want["blocks"].clone()).unwrap();
        assert_eq!(
            blocks, want_blocks,
            "case {i}: {:?} vs {:?}",
            case.a, case.b
        );
        let want_bits: u64 = want["bits"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            ratio.to_bits(),
            want_bits,
            "case {i}: {ratio} vs {}",
            f64::from_bits(want_bits)
        );
        long_autojunk += usize::from(case.autojunk && case.b.len() >= AUTOJUNK_MIN_LEN);
    }
    assert!(
        long_autojunk > 150,
        "only {long_autojunk} cases exercised autojunk"
    );
}

proptest! {
    #[test]
    fn bounded_and_reflexive_below_the_autojunk_length(a in "[a-dé]{0,30}", b in "[a-dé]{0,30}") {
        let r = str_similarity(&a, &b);
        prop_assert!((0.0..=1.0).contains(&r));
        prop_assert_eq!(str_similarity(&a, &a), 1.0);
    }
}
