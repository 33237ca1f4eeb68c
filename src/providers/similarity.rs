//! Ratcliff/Obershelp sequence similarity, computed the way Python's
//! `difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()` does:
//! find the longest common block, recurse on both sides, and return
//! `2 * matches / (len(a) + len(b))`. Ties pick the earliest block in `a`,
//! then in `b`, as difflib does, so the numbers agree with difflib's.

use std::collections::HashMap;
use std::hash::Hash;

/// Similarity of two sequences in `0.0..=1.0` (1.0 for two empty ones).
pub fn similarity<T: Eq + Hash>(a: &[T], b: &[T]) -> f64 {
    let total = a.len() + b.len();
    if total == 0 {
        return 1.0;
    }
    2.0 * matching_elements(a, b) as f64 / total as f64
}

/// [`similarity`] over the bytes of two strings.
pub fn str_similarity(a: &str, b: &str) -> f64 {
    similarity(a.as_bytes(), b.as_bytes())
}

fn matching_elements<T: Eq + Hash>(a: &[T], b: &[T]) -> usize {
    let mut b2j: HashMap<&T, Vec<usize>> = HashMap::new();
    for (j, item) in b.iter().enumerate() {
        b2j.entry(item).or_default().push(j);
    }
    let mut matches = 0;
    let mut queue = vec![(0, a.len(), 0, b.len())];
    while let Some((alo, ahi, blo, bhi)) = queue.pop() {
        let (i, j, k) = longest_match(a, &b2j, alo, ahi, blo, bhi);
        if k == 0 {
            continue;
        }
        matches += k;
        if alo < i && blo < j {
            queue.push((alo, i, blo, j));
        }
        if i + k < ahi && j + k < bhi {
            queue.push((i + k, ahi, j + k, bhi));
        }
    }
    matches
}

/// difflib's `find_longest_match` without junk: `(i, j, size)`.
fn longest_match<T: Eq + Hash>(
    a: &[T],
    b2j: &HashMap<&T, Vec<usize>>,
    alo: usize,
    ahi: usize,
    blo: usize,
    bhi: usize,
) -> (usize, usize, usize) {
    let (mut best_i, mut best_j, mut best) = (alo, blo, 0);
    let mut j2len: HashMap<usize, usize> = HashMap::new();
    let mut next: HashMap<usize, usize> = HashMap::new();
    for (i, item) in a.iter().enumerate().take(ahi).skip(alo) {
        next.clear();
        if let Some(js) = b2j.get(item) {
            for &j in js {
                if j < blo {
                    continue;
                }
                if j >= bhi {
                    break;
                }
                let k = j
                    .checked_sub(1)
                    .and_then(|p| j2len.get(&p))
                    .copied()
                    .unwrap_or(0)
                    + 1;
                next.insert(j, k);
                if k > best {
                    best_i = i + 1 - k;
                    best_j = j + 1 - k;
                    best = k;
                }
            }
        }
        std::mem::swap(&mut j2len, &mut next);
    }
    (best_i, best_j, best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Expected values printed by Python 3's
    /// `SequenceMatcher(None, a, b, autojunk=False).ratio()`.
    #[test]
    fn agrees_with_difflib() {
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
            assert!(
                (got - want).abs() < 1e-12,
                "{a:?} vs {b:?}: {got} != {want}"
            );
        }
    }

    #[test]
    fn works_on_token_sequences() {
        let a = ["init", "message", "result"];
        let b = ["init", "message", "tool_use", "result"];
        assert!((similarity(&a, &b) - 6.0 / 7.0).abs() < 1e-12);
    }

    proptest! {
        #[test]
        fn bounded_symmetric_in_size_and_reflexive(a in "[a-d]{0,30}", b in "[a-d]{0,30}") {
            let r = str_similarity(&a, &b);
            prop_assert!((0.0..=1.0).contains(&r));
            prop_assert_eq!(str_similarity(&a, &a), 1.0);
        }
    }
}
